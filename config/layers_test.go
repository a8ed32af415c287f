package config

import (
	"go/build"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layers is the README's paragraph on imports ("Imports run one way, from
// the bottom up"), as a table: each package of the module, and the
// project's packages its code (not its tests) may import. A lower package
// never imports a higher one; a package missing here fails the test, so a
// new one takes its place in the table and in the README.
var layers = map[string][]string{
	"retry":      {},
	"dlq":        {},
	"event":      {},
	"dashboard":  {},
	"kubernetes": {},
	"topology":   {"dlq"},
	"consumer":   {"dlq", "event", "retry", "topology"},
	"db":         {"event", "retry"},
	"dbtest":     {"db", "event", "retry"},
	"journal":    {"event", "retry"},
	"reconcile":  {"db", "event", "retry"},
	"config":     {"consumer", "db", "journal", "retry", "topology"},
	"observe":    {"config", "consumer", "db", "event", "journal", "reconcile", "topology"},
	"cli":        {"config", "consumer", "db", "dlq", "event", "journal", "observe", "reconcile", "retry", "topology"},
	".":          {"cli", "config", "consumer", "db", "dlq", "event", "journal", "observe", "reconcile", "retry", "topology"},
}

// The module's packages import each other only as the README says: read
// from each package's own files (go/build), so that an import up the
// layers, or a new package that is in no layer, fails here.
func TestImportsRunOneWay(t *testing.T) {
	const module = "transferconsumer"
	root := filepath.Join("..")
	dirs := []string{"."}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			dirs = append(dirs, e.Name())
		}
	}
	seen := 0
	for _, dir := range dirs {
		pkg, err := build.ImportDir(filepath.Join(root, dir), 0)
		if err != nil || len(pkg.GoFiles) == 0 {
			continue // no Go files of the module's build here: docs, SQL, a package of tests only
		}
		if _, err := os.Stat(filepath.Join(root, dir, "go.mod")); err == nil && dir != "." {
			continue // a module of its own (bench)
		}
		allowed, ok := layers[dir]
		if !ok {
			t.Errorf("package %s (%s/) is in no layer: add it to layers and to the README's paragraph on imports", pkg.Name, dir)
			continue
		}
		seen++
		for _, imp := range pkg.Imports {
			name, ours := strings.CutPrefix(imp, module+"/")
			if !ours {
				continue
			}
			if !slices.Contains(allowed, name) {
				t.Errorf("%s/ imports %s, which the README's layers do not let it import (it may import %v)", dir, name, allowed)
			}
		}
	}
	if seen < 10 {
		t.Fatalf("read the imports of %d packages, want the module's %d or so: is the test run from config/?", seen, len(layers))
	}
}
