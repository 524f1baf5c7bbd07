package main

import (
	"fmt"
	"io"

	"github.com/goroce/goroce/interop/capture/explain"
)

// writeNotes writes a packet's notes under its line, one a line, the inferred ones marked.
func writeNotes(w io.Writer, notes []explain.Note) {
	for _, n := range notes {
		mark := ""
		if n.Inferred {
			mark = " [inferred]"
		}
		fmt.Fprintf(w, "%s- %s%s\n", treeIndent, n.Text, mark)
	}
}

// writeStories writes the story of every connection the CM set up and of every queue pair of a capture.
func writeStories(w io.Writer, name string, a *explain.Analysis) {
	if len(a.CM) > 0 {
		fmt.Fprintf(w, "\nConnection manager (MADs on QP1) in %s, one connection at a time:\n", name)
		for _, c := range a.CM {
			fmt.Fprintf(w, "  connection %d, %v\n", c.ID, c)
			for _, s := range c.Story {
				fmt.Fprintf(w, "    %s\n", s)
			}
		}
	}
	if len(a.Pairs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nStory of %s, one queue pair at a time:\n", name)
	for _, p := range a.Pairs {
		fmt.Fprintf(w, "  pair %d, %v\n", p.ID, p)
		for _, s := range p.Story {
			fmt.Fprintf(w, "    %s\n", s)
		}
	}
}
