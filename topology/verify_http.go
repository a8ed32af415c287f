package topology

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"transferconsumer/dlq"
)

// Management reads a topology's definitions from RabbitMQ's management
// HTTP API, for Verify. Its user needs the management tag and access to
// the vhost (any permission there); it reads, never changes anything.
type Management struct {
	// URL is the API's base, http or https, with an optional path before
	// /api. Its userinfo, when there is one, is the API's credentials;
	// without, the broker URL's are used.
	URL *url.URL
	// URLFunc, when set, is called for URL at each Observe, so that a
	// credential rotated in a file is used at the next check.
	URLFunc func() (*url.URL, error)
	Client  *http.Client // nil: a client with a 10 s timeout
}

// Observe reads, in the vhost of brokerURL, what Verify needs of t: each
// partition queue, the DLQ, its bindings, the hash exchange and the DLX.
// An object that does not exist is nil in Observed. An error says why the
// API could not answer; it never holds a password.
func (m *Management) Observe(ctx context.Context, brokerURL string, t Spec, version string) (Observed, error) {
	obs := Observed{Version: version, Queues: map[string][]byte{}, Exchanges: map[string][]byte{}}
	base, user, password, vhost, err := m.target(brokerURL)
	if err != nil {
		return obs, err
	}
	get := func(kind, name, suffix string) ([]byte, error) {
		return m.get(ctx, base, user, password, "/api/"+kind+"/"+vhost+"/"+url.PathEscape(name)+suffix)
	}
	queues := []string{dlq.Queue(t.Prefix)}
	for i := range t.Queues {
		queues = append(queues, t.Queue(i))
	}
	for _, q := range queues {
		if obs.Queues[q], err = get("queues", q, ""); err != nil {
			return obs, err
		}
	}
	for _, x := range []string{t.Prefix, dlq.Exchange(t.Prefix)} {
		if obs.Exchanges[x], err = get("exchanges", x, ""); err != nil {
			return obs, err
		}
	}
	if obs.Queues[dlq.Queue(t.Prefix)] != nil {
		obs.DLQBindings, err = get("queues", dlq.Queue(t.Prefix), "/bindings")
	}
	return obs, err
}

// get returns the body of GET path, or nil when the object does not exist.
func (m *Management) get(ctx context.Context, api *url.URL, user, password, path string) ([]byte, error) {
	base := *api
	base.User = nil // the credentials go in a header, never in a URL an error may quote
	base.RawQuery, base.Fragment = "", ""
	// path is escaped already: the vhost "/" is %2F, which must stay so.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base.String(), "/")+path, nil)
	if err != nil {
		return nil, fmt.Errorf("management API: %w", err)
	}
	req.SetBasicAuth(user, password)
	// A few requests every 10 s at most: no connection is kept between
	// them, so none outlives the service's session.
	req.Close = true
	client := m.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("management API: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case err != nil:
		return nil, fmt.Errorf("management API: GET %s: %w", path, err)
	case resp.StatusCode == http.StatusNotFound:
		return nil, nil
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, fmt.Errorf("management API: GET %s: 401: user %q was refused: check the credentials "+
			"(MANAGEMENT_URL's, else AMQP_URL's) and that the user has the management tag", path, user)
	case resp.StatusCode == http.StatusForbidden:
		return nil, fmt.Errorf("management API: GET %s: 403: user %q may not read the vhost: give it access to the vhost", path, user)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("management API: GET %s: %s", path, resp.Status)
	}
	return body, nil
}
