package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestConfigRejectsBadValuesNamingTheVariable(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"QUEUE_COUNT": "0"}, "QUEUE_COUNT"},
		{map[string]string{"QUEUE_COUNT": "many"}, "QUEUE_COUNT"},
		{map[string]string{"AMQP_URL": "http://broker"}, "AMQP_URL"},
		{map[string]string{"AMQP_URL": "amqp://u:s3cret@[::1"}, "AMQP_URL"},
		{map[string]string{"AMQP_URL": "amqp://u:s3cret@node1/, http://node2/"}, "AMQP_URL: URL 2"},
		{map[string]string{"DATABASE_URL": "mysql://db"}, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "::"}, "DATABASE_URL"},
		{map[string]string{"DELIVERY_LIMIT": "0"}, "DELIVERY_LIMIT"},
		{map[string]string{"SHUTDOWN_TIMEOUT": "soon"}, "SHUTDOWN_TIMEOUT"},
		{map[string]string{"RETRY_MIN": "5s", "RETRY_MAX": "1s"}, "RETRY_MIN/RETRY_MAX"},
		{map[string]string{"TOPOLOGY_PREFIX": ""}, "TOPOLOGY_PREFIX"},
		{map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := loadConfig()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v does not name %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

func TestConfigDefaultsAreValid(t *testing.T) {
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.QueueCount != 8 || c.Prefix != "transfers" || c.AMQPURL != "amqp://guest:guest@localhost:5672/" ||
		c.DatabaseURL != "postgres://postgres@localhost:5432/transfers?sslmode=disable" {
		t.Errorf("defaults differ from the contract: %+v", c)
	}
}

func TestHelpListsEveryVariable(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"AMQP_URL", "DATABASE_URL", "QUEUE_COUNT", "TOPOLOGY_PREFIX", "DELIVERY_LIMIT",
		"DECLARE_TOPOLOGY", "SHUTDOWN_TIMEOUT", "LOG_FORMAT", "migrate", "topology"} {
		if !strings.Contains(out.String(), v) {
			t.Errorf("--help does not mention %s", v)
		}
	}
}

func TestRedactHidesPasswords(t *testing.T) {
	for _, raw := range []string{"amqp://user:s3cret@host:5672/vh", "amqp://u:s3cret@n1/,amqp://u:s3cret@n2/"} {
		if got := redact(raw); strings.Contains(got, "s3cret") {
			t.Errorf("redact kept the password: %s", got)
		}
	}
}

// AMQP_URL may list a cluster's nodes; each is an AMQP URL of its own.
func TestAMQPURLListsNodes(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://g:g@n1:5672/, amqp://g:g@n2:5672/,amqp://g:g@n3:5672/")
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.consumerConfig(nil).URLs; len(got) != 3 || got[1] != "amqp://g:g@n2:5672/" {
		t.Errorf("URLs = %q, want the three nodes in order", got)
	}
}

func TestUnknownCommandFails(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"frobnicate"}, &out, &out); err == nil || !strings.Contains(err.Error(), "frobnicate") {
		t.Errorf("got %v", err)
	}
}
