// Command needle-generate streams generated text:
//
//	needle-generate [MODEL.cact] [PROMPT]
//
// Without a model argument it runs the demo model ($NEEDLE_DEMO_MODEL, else
// $NEEDLE_LIB_DIR/models/needle-demo.cact, else the repository's build/models/needle-demo.cact):
// the trained tool-calling demo model (models/README.md), prompted without the chat template.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	needle "github.com/cactus-compute/needle/bindings/go"
)

func demoModel() string {
	if p := os.Getenv("NEEDLE_DEMO_MODEL"); p != "" {
		return p
	}
	if d := os.Getenv("NEEDLE_LIB_DIR"); d != "" {
		return filepath.Join(d, "models", "needle-demo.cact")
	}
	_, file, _, _ := runtime.Caller(0) // .../bindings/go/cmd/needle-generate/main.go
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "build", "models", "needle-demo.cact")
}

func main() {
	path, prompt := demoModel(), "Once upon a time"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	if len(os.Args) > 2 {
		prompt = os.Args[2]
	}
	fmt.Printf("needle %s (ABI %d), model %s\n", needle.Version(), needle.LibraryABIVersion(), path)
	if err := run(path, prompt); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(path, prompt string) error {
	m, err := needle.Load(path)
	if err != nil {
		return err
	}
	defer m.Close()
	s, err := m.NewState()
	if err != nil {
		return err
	}
	defer s.Close()
	p := needle.DefaultGenerateParams()
	p.MaxTokens, p.Temperature, p.Seed = 32, 0.8, 7
	r, err := s.Generate(prompt, p, nil, func(_ uint32, text string) bool {
		fmt.Print(text)
		return false // keep going
	})
	if err != nil {
		return err
	}
	fmt.Printf("\n[%d prompt tokens, %d generated, stop reason %d]\n", r.PromptTokens, r.GeneratedTokens, r.StopReason)
	return nil
}
