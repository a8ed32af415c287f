package config

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// withoutCode are the decision records that do not name their code yet.
// An entry goes once its record has a Code: line.
var withoutCode = []string{}

// adrCode returns the paths that the record text names on its Code: line,
// the paragraph before its first section that begins with "Code: ": each
// path in backquotes, relative to the repository's root, a folder's with a
// trailing slash; the prose between them is not read. ok is false when
// the record has no such line.
func adrCode(text string) (paths []string, ok bool) {
	head, _, _ := strings.Cut(text, "\n## ")
	for _, para := range strings.Split(head, "\n\n") {
		para = strings.TrimSpace(para)
		if !strings.HasPrefix(para, "Code: ") {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]*)`").FindAllStringSubmatch(para, -1) {
			paths = append(paths, m[1])
		}
		return paths, true
	}
	return nil, false
}

// Every decision record says, near its top, which files and folders it
// describes (Code: …), so that a change to one of them reads the record;
// and each path it names is in the repository, so that a move or a
// removal that leaves the record behind fails here.
func TestADRsNameTheirCode(t *testing.T) {
	files, err := filepath.Glob("../adr/[0-9][0-9][0-9][0-9]-*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no decision records in ../adr")
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(file)
		paths, ok := adrCode(string(b))
		switch {
		case slices.Contains(withoutCode, name):
			if ok {
				t.Errorf("adr/%s has its Code: line now: take it out of withoutCode", name)
			}
			continue
		case !ok:
			t.Errorf("adr/%s has no Code: line before its first section, naming the files it describes", name)
			continue
		case len(paths) == 0:
			t.Errorf("adr/%s: its Code: line names no path in backquotes", name)
		}
		for _, p := range paths {
			c := path.Clean(p)
			if path.IsAbs(p) || c != strings.TrimSuffix(p, "/") || c == "." || c == ".." || strings.HasPrefix(c, "../") {
				t.Errorf("adr/%s names %q on its Code: line: not a path inside the repository", name, p)
				continue
			}
			fi, err := os.Stat(filepath.Join("..", filepath.FromSlash(p)))
			switch {
			case err != nil:
				t.Errorf("adr/%s names %s on its Code: line, which the repository does not hold", name, p)
			case strings.HasSuffix(p, "/") && !fi.IsDir():
				t.Errorf("adr/%s names %s on its Code: line as a folder; it is a file", name, p)
			case !strings.HasSuffix(p, "/") && fi.IsDir():
				t.Errorf("adr/%s names %s on its Code: line as a file; it is a folder (write %s/)", name, p, p)
			}
		}
	}
}

// adrCode reads the Code: paragraph only, before the first section.
func TestADRCodeLine(t *testing.T) {
	for _, tt := range []struct {
		text  string
		paths []string
		ok    bool
	}{
		{"# 1. x\n\nStatus: accepted\n\nCode: `a/b.go`, `c/`.\n\n## Context\n", []string{"a/b.go", "c/"}, true},
		{"# 1. x\n\nCode: `a.go`, the harness,\n`b/`.\n\n## Context\n", []string{"a.go", "b/"}, true},
		{"# 1. x\n\nStatus: accepted\n\n## Context\n\nCode: `a.go`\n", nil, false},
		{"# 1. x\n\nStatus: see Code: `a.go`\n\n## Context\n", nil, false},
		{"# 1. x\n\nCode: none\n\n## Context\n", nil, true},
	} {
		paths, ok := adrCode(tt.text)
		if ok != tt.ok || !slices.Equal(paths, tt.paths) {
			t.Errorf("adrCode(%q) = %q, %v; want %q, %v", tt.text, paths, ok, tt.paths, tt.ok)
		}
	}
}
