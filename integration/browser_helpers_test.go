package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// browser is one headless Chromium, with one tab, driven through the
// DevTools protocol. It closes when the test ends.
type browser struct {
	t   *testing.T
	ctx context.Context // the tab's; no deadline: each step sets its own
}

// chromiumPath returns the Chromium the browser tests run: TEST_CHROMIUM,
// else Debian's /usr/bin/chromium. Without one the test skips, but with
// CI=true, where a missing browser fails like a missing broker.
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := getenv("TEST_CHROMIUM", "/usr/bin/chromium")
	found, err := exec.LookPath(p)
	if err != nil {
		msg := fmt.Sprintf("no Chromium at %s (%v): install Debian's chromium package, or set TEST_CHROMIUM", p, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true, so this fails)")
		}
		t.Skip(msg)
	}
	return found
}

// newBrowser starts Chromium headless with a fresh profile and a
// 1280×900 window. The flags keep it from reaching out to the network
// (background networking, component updates, sync, QUIC) and let it run as
// root (no sandbox), as CI does.
func newBrowser(t *testing.T, execPath string) *browser {
	t.Helper()
	profile := t.TempDir() // removed after the browser has exited (cleanups run in reverse)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(execPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 900),
	)
	// chromedp's own complaints go to the test's log while it runs, and
	// nowhere once it has ended.
	var mu sync.Mutex
	open := true
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if open {
			t.Logf("chromium: "+format, args...)
		}
	}
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithErrorf(logf))
	t.Cleanup(func() {
		closing, done := context.WithTimeout(ctx, 15*time.Second)
		defer done()
		if err := chromedp.Cancel(closing); err != nil {
			logf("closing: %v", err)
		}
		cancel()
		cancelAlloc() // waits for the process to exit
		mu.Lock()
		open = false
		mu.Unlock()
	})
	// The first run starts the process and binds its life to the context it
	// is given, so it runs on ctx itself, without a deadline, and is waited
	// for here with one.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("browser: start %s: %v", execPath, err)
		}
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("browser: %s did not start within 60s", execPath)
	}
	// What goes wrong in the page (an uncaught exception, a console
	// error) goes to the test's log too: a step that times out is often
	// explained there.
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			text := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				text += " " + d.Exception.Description
			}
			logf("page: uncaught exception at %s:%d: %s", d.URL, d.LineNumber+1, text)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
				var parts []string
				for _, a := range ev.Args {
					if a.Description != "" {
						parts = append(parts, a.Description)
					} else {
						parts = append(parts, string(a.Value))
					}
				}
				logf("page: console.%s: %s", ev.Type, strings.Join(parts, " "))
			}
		}
	}); err != nil {
		t.Fatalf("browser: listen to the page: %v", err)
	}
	return &browser{t: t, ctx: ctx}
}

// step runs actions with a deadline; on failure it saves what the page
// showed (a screenshot, its text) beside the test's other files, then
// fails the test saying which step it was.
func (b *browser) step(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %s: %v%s", what, err, b.evidence())
	}
}

// browserRun is step for one action with a value.
func browserRun[T any](b *browser, what string, timeout time.Duration, action chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	v, err := chromedp.Run(ctx, action)
	if err != nil {
		b.t.Fatalf("browser: %s: %v%s", what, err, b.evidence())
	}
	return v
}

// evidence saves a screenshot of the page as it is, and returns its path
// and the page's text, for a failure message.
func (b *browser) evidence() string {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	var out strings.Builder
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		p := filepath.Join(screenshotDir(b.t), "failed-"+randomSuffix()+".png")
		if os.WriteFile(p, png, 0o644) == nil {
			fmt.Fprintf(&out, "\nscreenshot: %s", p)
		}
	}
	if text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`)); err == nil {
		if len(text) > 4000 {
			text = text[:4000] + "…"
		}
		fmt.Fprintf(&out, "\npage text:\n%s", text)
	}
	return out.String()
}

// screenshotDir is where screenshots go: TEST_SCREENSHOT_DIR when set (made
// if missing), else the test's temporary directory.
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TEST_SCREENSHOT_DIR")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("TEST_SCREENSHOT_DIR: %v", err)
	}
	return dir
}

// managementLogin opens the management UI at base (no credentials in it)
// and logs in through its form, as a person does. The form is the same on
// 3.10 and 4.x: inputs named username and password, a submit button, and
// once logged in a "Log out" form in #logout.
func (b *browser) managementLogin(base, user, password string) {
	b.t.Helper()
	b.step("open the management UI's login form", 30*time.Second,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#login input[name="username"]`)),
	)
	b.step("log in as "+user, 30*time.Second,
		chromedp.SendKeys(chromedp.CSS(`#login input[name="username"]`), user),
		chromedp.SendKeys(chromedp.CSS(`#login input[name="password"]`), password),
		chromedp.Click(chromedp.CSS(`#login input[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#logout`)),
	)
	// The UI redraws the statistics of the page every 5 s by default, and
	// the page grows when a chart appears: a click aimed before the redraw
	// lands beside its target. A person reading letters stops it too.
	b.choose(`#update-every`, "Do not refresh")
}

// chooseOption selects, in the select element sel (a CSS selector), the
// option a person reads as label, as if picked with the mouse (the page
// hears a change event), and returns the label now selected, or the
// labels there are when none is label.
func chooseOption(sel, label string) chromedp.Action[string] {
	return chromedp.Evaluate[string](`((sel, label) => {
		const s = document.querySelector(sel);
		if (!s) return 'no ' + sel;
		const o = [...s.options].find(o => o.textContent.trim() === label);
		if (!o) return 'none of: ' + [...s.options].map(o => o.textContent.trim()).join(' | ');
		s.value = o.value;
		s.dispatchEvent(new Event('change', {bubbles: true}));
		return s.selectedOptions[0].textContent.trim();
	})(` + jsString(sel) + `, ` + jsString(label) + `)`)
}

// choose is chooseOption as a step of b that fails the test when the
// option is not there.
func (b *browser) choose(sel, label string) {
	b.t.Helper()
	if got := browserRun(b, "choose "+label, 10*time.Second, chooseOption(sel, label)); got != label {
		b.t.Fatalf("browser: choose %q in %s: %s", label, sel, got)
	}
}

// clickStill clicks the element sel (a CSS selector or an XPath) once it
// has stood still for a few frames. The UI slides sections open and draws
// charts as their data arrives, and a click aimed while the page still
// moves is pressed on the target and released beside it, which clicks
// nothing.
func (b *browser) clickStill(what string, sel chromedp.Search) {
	b.t.Helper()
	b.step(what, 30*time.Second, chromedp.WaitVisible(sel))
	browserRun(b, what+": wait for it to stand still", 30*time.Second, chromedp.Poll[bool](`((sel) => {
		const el = sel.startsWith('/')
			? document.evaluate(sel, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue
			: document.querySelector(sel);
		if (!el) return false;
		const r = el.getBoundingClientRect(), at = [r.x, r.y + window.scrollY, r.width, r.height].join();
		const s = window.__stillness || (window.__stillness = {});
		if (s[sel] && s[sel].at === at) s[sel].frames++; else s[sel] = {at: at, frames: 0};
		return s[sel].frames >= 5;
	})(`+jsString(string(sel))+`)`))
	b.step(what, 30*time.Second, chromedp.Click(sel))
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	j, _ := json.Marshal(s)
	return string(j)
}

// managementCredentials splits the management URL into the address the
// browser opens and the user and password it logs in with.
func managementCredentials(t *testing.T, raw string) (base, user, password string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("management URL: %v", err)
	}
	user, password = "guest", "guest"
	if u.User != nil {
		user = u.User.Username()
		password, _ = u.User.Password()
	}
	u.User = nil
	return strings.TrimRight(u.String(), "/"), user, password
}
