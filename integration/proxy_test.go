package integration

import (
	"net"
	"sync"
	"testing"
)

// proxy forwards TCP connections to a target and can be cut: down closes
// every connection and refuses new ones, as a database that stopped would;
// up listens again on the same address. It lets a test take the database
// away from the service without touching the server other tests share.
type proxy struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	// held, while frozen, stops what clients send from reaching the
	// server; what the server sends still flows. thaw ends a freeze.
	held sync.RWMutex
	thaw func()
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() { p.down(); p.wg.Wait() })
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.pipe(c)
		}
	}()
}

func (p *proxy) pipe(client net.Conn) {
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	server, err := net.Dial("tcp", target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // cut while dialling
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client], p.conns[server] = struct{}{}, struct{}{}
	p.mu.Unlock()
	for _, pair := range []struct {
		dst, src net.Conn
		hold     bool
	}{{server, client, true}, {client, server, false}} {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := pair.src.Read(buf)
				if n > 0 {
					if pair.hold {
						p.held.RLock()
					}
					_, werr := pair.dst.Write(buf[:n])
					if pair.hold {
						p.held.RUnlock()
					}
					if werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			pair.dst.Close()
			pair.src.Close()
		}()
	}
}

// freeze stops forwarding what clients send, until thaw (at the latest
// when the test ends): a broker behind it sees no more acks, while its
// deliveries still arrive.
func (p *proxy) freeze() {
	p.held.Lock()
	thawed := false
	var once sync.Once
	p.thaw = func() { once.Do(func() { thawed = true; p.held.Unlock() }) }
	p.t.Cleanup(func() {
		if !thawed {
			p.thaw()
		}
	})
}

// down refuses new connections and resets the open ones.
func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// up accepts connections again, on the same address.
func (p *proxy) up() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy up again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

// retarget sends new connections to target from now on and resets the open
// ones, as a DNS name that moved to another server would.
func (p *proxy) retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}
