package iblayer

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// captureDirs are the directories of real rxe captures the tests read: the golden captures every
// checkout has, the ones another engineer is adding under rxe/, and the full lab captures in shared/,
// which only a checkout beside shared/ has.
var captureDirs = []string{"../testdata", "../testdata/rxe", "../../../shared/rxe-lab/pcaps", "/work/shared/rxe-lab/pcaps"}

// record is one packet of a capture file.
type record struct {
	name string // file#n
	data []byte
	ci   gopacket.CaptureInfo
	link layers.LinkType
}

// readCaptures returns every packet of every pcap or pcapng file in the capture directories that exist,
// each directory's files only once.
func readCaptures(t testing.TB) []record {
	t.Helper()
	var out []record
	seen := map[string]bool{}
	for _, dir := range captureDirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.pcap*"))
		for _, f := range files {
			abs, err := filepath.Abs(f) // the two spellings of shared/ may name the same files
			if err != nil || seen[abs] {
				continue
			}
			seen[abs] = true
			out = append(out, readFile(t, f)...)
		}
	}
	if len(out) == 0 {
		t.Fatal("no captures found")
	}
	return out
}

func readFile(t testing.TB, file string) []record {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	magic, err := br.Peek(4)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var src interface {
		ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
		LinkType() layers.LinkType
	}
	if string(magic) == "\x0a\x0d\x0d\x0a" {
		src, err = pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
	} else {
		src, err = pcapgo.NewReader(br)
	}
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []record
	for n := 1; ; n++ {
		data, ci, err := src.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s #%d: %v", file, n, err)
		}
		out = append(out, record{name: filepath.Base(file) + "#" + strconv.Itoa(n), data: data, ci: ci, link: src.LinkType()})
	}
}
