//go:build ignore

// gen writes the dashboard's JSON to prometheus/dashboard.json: run by
// `go generate ./dashboard`.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"transferconsumer/dashboard"
)

func main() {
	out, err := dashboard.JSON()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// go generate runs this in the package's folder.
	if err := os.WriteFile(filepath.Join("..", dashboard.File), out, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
