// Command goroce is goroce's single command: a software RoCEv2 NIC and the tools around it, each a
// subcommand. Run "goroce help" for the list.
//
// The command is built with profile-guided optimization: `go build` and `go run` use default.pgo in
// this directory, CPU profiles of goroce's ping-pong and WRITE stream benchmarks and of the raw UDP
// ping-pong `goroce perf` compares with. pgo.sh makes it again.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// command is one subcommand: its name, a one-line help, and what it runs. run gets the arguments after
// the subcommand's name; it returns errExit to set the exit status without printing anything more, and
// any other error to have it printed.
type command struct {
	name string
	help string
	run  func(args []string) error
}

// commands lists the subcommands in the order help shows them. Each file that implements one adds it
// with register from its init function.
var commands []command

// register adds a subcommand.
func register(c command) { commands = append(commands, c) }

func init() {
	register(command{"dump", "decode RoCEv2 captures: one line per packet, per-QP summary, ICRC check", runDump})
	register(command{"help", "list the subcommands", runHelp})
}

// exitError carries an exit status a subcommand chose after reporting on its own.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// errUsage makes main print the usage and exit with status 2.
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run dispatches to a subcommand and returns the process exit status.
func run(args []string, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(args[1:])
		var code exitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &code):
			return int(code)
		case errors.Is(err, errUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "goroce %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "goroce: unknown subcommand %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: goroce <subcommand> [arguments]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "subcommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.help)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, `Run "goroce <subcommand> -h" for its flags.`)
}

func runHelp(args []string) error {
	usage(os.Stdout)
	return nil
}

// parseWithHost parses args like getopt does for rdma-core's and perftest's tools: the optional host
// argument may stand among the flags. It returns the host, or "" when there is none.
func parseWithHost(fs *flag.FlagSet, args []string) (string, error) {
	host := ""
	for {
		if err := fs.Parse(args); err != nil {
			return "", errUsage
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return host, nil
		}
		if host != "" {
			fs.Usage()
			return "", errUsage
		}
		host, args = rest[0], rest[1:]
	}
}
