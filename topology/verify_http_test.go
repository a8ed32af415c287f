package topology

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// Observe asks for each object in the broker URL's vhost, escaped (the
// vhost "/" is %2F), with MANAGEMENT_URL's credentials or else the broker
// URL's, and takes a 404 for an object that does not exist.
func TestManagementObserve(t *testing.T) {
	var paths []string
	var users []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath())
		u, p, _ := r.BasicAuth()
		users = append(users, u+":"+p)
		switch {
		case u == "bad":
			w.WriteHeader(http.StatusUnauthorized)
		case strings.HasSuffix(r.URL.Path, "/p.1"):
			http.NotFound(w, r)
		default:
			w.Write([]byte(`{"type":"quorum"}`))
		}
	}))
	defer srv.Close()
	top := Spec{Prefix: "p", Queues: 2, DeliveryLimit: 3}

	base, _ := url.Parse(srv.URL + "/prefix/")
	m := &Management{URL: base}
	obs, err := m.Observe(context.Background(), "amqp://svc:s3cret@h:5672/", top, "4.3.6")
	if err != nil {
		t.Fatal(err)
	}
	if obs.Queues["p.1"] != nil || obs.Queues["p.0"] == nil || obs.Exchanges["p.dlx"] == nil || obs.DLQBindings == nil {
		t.Errorf("observed %+v", obs)
	}
	for _, want := range []string{"/prefix/api/queues/%2F/p.dlq", "/prefix/api/queues/%2F/p.0", "/prefix/api/exchanges/%2F/p",
		"/prefix/api/exchanges/%2F/p.dlx", "/prefix/api/queues/%2F/p.dlq/bindings"} {
		if !slices.Contains(paths, want) {
			t.Errorf("no GET %s among %v", want, paths)
		}
	}
	if users[0] != "svc:s3cret" {
		t.Errorf("asked as %s, want the broker URL's user", users[0])
	}

	paths, users = nil, nil
	withUser, _ := url.Parse(strings.Replace(srv.URL, "http://", "http://mon:pw@", 1))
	m = &Management{URL: withUser}
	if _, err := m.Observe(context.Background(), "amqp://svc:s3cret@h:5672/a%2Fb", top, "3.10.8"); err != nil {
		t.Fatal(err)
	}
	if users[0] != "mon:pw" || paths[0] != "/api/queues/a%2Fb/p.dlq" {
		t.Errorf("asked %s as %s, want /api/queues/a%%2Fb/p.dlq as mon", paths[0], users[0])
	}

	bad, _ := url.Parse(strings.Replace(srv.URL, "http://", "http://bad:s3cret@", 1))
	_, err = (&Management{URL: bad}).Observe(context.Background(), "amqp://svc:s3cret@h:5672/", top, "3.10.8")
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "management tag") ||
		strings.Contains(err.Error(), "s3cret") {
		t.Errorf("a refused login: %v", err)
	}
}
