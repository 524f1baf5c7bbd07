#!/bin/sh
# pgo.sh regenerates default.pgo, the CPU profile `go build` and `go run` use for this command
# (profile-guided optimization, https://go.dev/doc/pgo; -pgo=auto picks up default.pgo in a main
# package's directory). It profiles a one-process SEND ping-pong and a 64 KiB WRITE stream over
# loopback sockets, and the raw UDP ping-pong `goroce perf` compares goroce's with, so that the
# baseline is built with the same care. A program that embeds goroce gets the same by adding these
# profiles to its own main package's default.pgo (`go tool pprof -proto a.pprof b.pprof > merged`).
# Run it from anywhere in the module after the datapath changes much; it takes about a minute.
set -eu
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -run '^$' -bench 'BenchmarkSendPingPong$' -benchtime 300000x -cpuprofile "$tmp/pingpong.pprof" -o "$tmp/root.test" .
go test -run '^$' -bench 'BenchmarkWriteStream$' -benchtime 3s -cpuprofile "$tmp/write.pprof" -o "$tmp/root.test" .
go test -run '^$' -bench 'BenchmarkRawPingPong/size=64$' -benchtime 200000x -cpuprofile "$tmp/raw.pprof" -o "$tmp/conn.test" ./internal/conn
go tool pprof -proto "$tmp/pingpong.pprof" "$tmp/write.pprof" "$tmp/raw.pprof" > cmd/goroce/default.pgo
