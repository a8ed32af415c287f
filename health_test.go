package main

import (
	"errors"
	"net/http"
	"reflect"
	"testing"

	"transferconsumer/db"
)

// While the schema lacks migrations, /readyz says so in words, lists them,
// and says the consumer waits for the schema, not for the database.
func TestReadinessSaysTheSchemaIsBehind(t *testing.T) {
	h := &health{}
	h.setStarting("connect to database: dial tcp: connection refused")
	code, body := h.readiness()
	if code != http.StatusServiceUnavailable || body["schema"] != "not checked yet: waiting for the database" ||
		body["broker"] != "not started: waiting for the database" {
		t.Errorf("before the database: %d %v", code, body)
	}

	behind := &db.Behind{Missing: []string{"0009_producer_conflict_once.sql"}, Role: "svc",
		Refused: errors.New("pq: permission denied for schema public (42501)")}
	h.schemaWaiting(behind)
	code, body = h.readiness()
	if code != http.StatusServiceUnavailable || body["ready"] != false {
		t.Errorf("behind: %d, ready %v", code, body["ready"])
	}
	if body["schema"] != behind.Error() || !reflect.DeepEqual(body["missing_migrations"], behind.Missing) {
		t.Errorf("behind: schema %q, missing %v", body["schema"], body["missing_migrations"])
	}
	if body["broker"] != "not started: waiting for the schema" {
		t.Errorf("behind: broker %q", body["broker"])
	}

	h.schemaWaiting(errors.New("migrate: pq: cannot execute CREATE TABLE in a read-only transaction (25006)"))
	if _, body = h.readiness(); body["missing_migrations"] != nil || body["schema"] == "ok" {
		t.Errorf("another failure: %v", body)
	}
	h.schemaCurrent()
	if _, body = h.readiness(); body["schema"] != "ok" || body["missing_migrations"] != nil {
		t.Errorf("current: %v", body)
	}
}
