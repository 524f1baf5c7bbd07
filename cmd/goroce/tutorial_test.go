package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tutorialPrompt starts the lines of docs/tutorial.md that TestTutorial runs.
const tutorialPrompt = "$ go run ./cmd/goroce "

// tutorialCommand is a command line of the tutorial and the output it shows under it.
type tutorialCommand struct {
	args  []string
	shown []string // the lines shown, without those that are "..."
}

// tutorialCommands returns every command line of a tutorial, the lines in fenced code blocks that start
// with tutorialPrompt, in order, each with the output lines that follow it up to the next command or
// the block's end.
func tutorialCommands(md []byte) []*tutorialCommand {
	var cmds []*tutorialCommand
	var cur *tutorialCommand
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "```"):
			fenced, cur = !fenced, nil
		case !fenced:
		case strings.HasPrefix(l, tutorialPrompt):
			cur = &tutorialCommand{args: strings.Fields(strings.TrimPrefix(l, tutorialPrompt))}
			cmds = append(cmds, cur)
		case strings.HasPrefix(l, "$ "):
			cur = nil
		case cur != nil && strings.TrimSpace(l) != "...":
			cur.shown = append(cur.shown, l)
		}
	}
	return cmds
}

// repeatable reports whether a command prints the same every time, given the files the demo wrote
// before it: not the demo, whose QP numbers, PSNs and timing are its own each run, nor a command that
// reads what the demo wrote. A simulator's run is a function of its seed, except for the wall-clock
// time it reports, on the line with "events in".
func repeatable(args []string, demoFiles map[string]bool) bool {
	if args[0] == "demo" {
		return false
	}
	for _, a := range args {
		if demoFiles[a] {
			return false
		}
	}
	return true
}

// TestTutorial runs the commands of docs/tutorial.md in order, each of which must exit 0, and checks that
// the files they write (-w, -o, -out) are there. It builds goroce once and runs it for "go run
// ./cmd/goroce", in a directory of its own that links every entry of the repository's root, so that the
// tutorial's paths into the repository work and what its commands write stays out of the tree.
func TestTutorial(t *testing.T) {
	const root = "../.."
	md, err := os.ReadFile(filepath.Join(root, "docs", "tutorial.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := tutorialCommands(md)
	if len(cmds) < 12 {
		t.Fatalf("docs/tutorial.md has %d commands starting with %q; the tutorial has more", len(cmds), tutorialPrompt)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build goroce with")
	}
	bin := filepath.Join(t.TempDir(), "goroce")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	work := t.TempDir()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(abs)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(abs, e.Name()), filepath.Join(work, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	demoFiles := map[string]bool{}
	for _, c := range cmds {
		args := c.args
		line := "goroce " + strings.Join(args, " ")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = work
		start := time.Now()
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("%s: %v\n%s", line, err, lastLines(string(out), 15))
			continue
		}
		for i, a := range args[:len(args)-1] {
			if a == "-w" || a == "-o" || a == "-out" {
				if _, err := os.Stat(filepath.Join(work, args[i+1])); err != nil {
					t.Errorf("%s: %s %s: %v", line, a, args[i+1], err)
				}
				if args[0] == "demo" {
					demoFiles[args[i+1]] = true
				}
			}
		}
		if repeatable(args, demoFiles) {
			got := map[string]bool{}
			for _, l := range strings.Split(string(out), "\n") {
				got[strings.TrimRight(l, " ")] = true
			}
			for _, l := range c.shown {
				if !got[strings.TrimRight(l, " ")] && !strings.Contains(l, "events in") {
					t.Errorf("%s: the tutorial shows a line the command does not print:\n%s", line, l)
				}
			}
		}
		t.Logf("%s: ok in %v, %d bytes of output", line, time.Since(start).Round(time.Millisecond), len(out))
	}
}
