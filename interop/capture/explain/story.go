package explain

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/goroce/goroce/wire"
)

// story tells a pair's story in a few sentences, from its Stats.
func story(pr *Pair) []string {
	s := &pr.Stats
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	span := fmtDur(s.End.Sub(s.Start))
	switch pr.Transport {
	case wire.TransportUD:
		if pr.A.Known && pr.A.QPN == gsiQPN && pr.B.Known && pr.B.QPN == gsiQPN {
			say("%s of the connection manager between %v and %v over %s; the CM resends its own requests on their timeouts (its story is told above, by connection).",
				plural(s.Packets, "MAD"), pr.A.Addr, pr.B.Addr, span)
			break
		}
		say("%s between %v and %v over %s; UD has no acknowledgments and no resends.",
			plural(s.Packets, "datagram"), pr.A, pr.B, span)
	case wire.TransportUC:
		say("%s between %v and %v over %s, %s; UC has PSNs but no acknowledgments and no resends.",
			plural(s.Packets, "packet"), pr.A, pr.B, span, plural(s.Messages, "message"))
	default:
		who := fmt.Sprintf("%v sends requests, %v answers", pr.A, pr.B)
		if s.Bidirectional {
			who = fmt.Sprintf("%v and %v both send requests and answer the other's", pr.A, pr.B)
		}
		say("%s over %s: %s.", plural(s.Packets, "packet"), span, who)
		if s.Requests > 0 {
			say("%s: %s sent for the first time, ending %s, and %s sent again.", plural(s.Requests, "request packet"),
				plural(s.Requests-s.Retransmits, "packet"), plural(s.Messages, "message"), plural(s.Retransmits, "packet"))
		}
	}
	if s.Lost+s.Dropped+s.Marked+s.Copied > 0 {
		var f []string
		for _, x := range []struct {
			n    int
			what string
		}{{s.Lost, "lost on the way"}, {s.Dropped, "dropped by the receiver"}, {s.Marked, "marked CE"}, {s.Copied, "copied by the network"}} {
			if x.n > 0 {
				f = append(f, strconv.Itoa(x.n)+" "+x.what)
			}
		}
		say("The capture's comments: %s.", join(f))
	}
	if s.Retransmits > 0 {
		var f []string
		for _, x := range []struct {
			n    int
			what string
		}{{s.AfterTimeout, "began a resend after a timeout"}, {s.AfterNAK, "after a NAK"}, {s.AfterRNR, "after an RNR NAK"},
			{s.AfterReadGap, "asked again for READ responses that went missing"}, {s.InBurst, "went on with a resend (go-back-N)"},
			{s.Probes, "were tail-loss probes"}} {
			if x.n > 0 {
				f = append(f, strconv.Itoa(x.n)+" "+x.what)
			}
		}
		how := "inferred"
		switch {
		case s.Traced == s.Retransmits:
			how = "as the sender's own trace says"
		case s.Traced > 0:
			how = strconv.Itoa(s.Traced) + " as the sender's trace says, the rest inferred"
		}
		say("Of the packets sent again, %s (%s).", join(f), how)
	}
	if pr.Transport == wire.TransportRC && s.Responses > 0 {
		f := []string{plural(s.ACKs, "ACK")}
		if s.NAKs > 0 {
			f = append(f, plural(s.NAKs, "NAK")+" for a PSN sequence error")
		}
		if s.RNRNAKs > 0 {
			f = append(f, plural(s.RNRNAKs, "RNR NAK"))
		}
		if s.ErrorNAKs > 0 {
			f = append(f, plural(s.ErrorNAKs, "NAK")+" for a remote error")
		}
		if n := s.Responses - s.ACKs - s.NAKs - s.RNRNAKs - s.ErrorNAKs; n > 0 {
			what := " READ responses or atomic ACKs"
			if n == 1 {
				what = " READ response or atomic ACK"
			}
			f = append(f, itoa(n)+what)
		}
		line := "Responses: " + join(f)
		if s.MaxCoalesced > 1 {
			line += fmt.Sprintf("; one ACK acknowledged up to %d request packets", s.MaxCoalesced)
		}
		if s.Duplicates > 0 {
			line += "; " + plural(s.Duplicates, "response") + " sent again for duplicate requests"
		}
		if s.MSN >= 0 {
			line += fmt.Sprintf("; the last MSN is %d", s.MSN)
		}
		say("%s.", line)
	}
	if s.AckOnReadAtomic > 0 {
		say("%s a READ's or atomic's last PSN: a requester must ask again for their responses, and rxe's completer completes them with nothing placed.",
			plural(s.AckOnReadAtomic, "plain ACK")+" carried")
	}
	if s.PSNGaps > 0 {
		say("%s in the PSNs: a message dropped for each.", plural(s.PSNGaps, "gap"))
	}
	if s.CNPs > 0 {
		say("%s: the receiver saw CE marks and asked the sender to slow down.", plural(s.CNPs, "CNP"))
	}
	if s.Malformed > 0 {
		say("%s did not decode whole.", plural(s.Malformed, "packet"))
	}
	if pr.Inferred {
		say("The two QPs were matched by elimination, or one's QPN is unknown: a BTH names only the destination QP.")
	}
	return out
}

// join lists words: "a", "a and b", "a, b and c".
func join(f []string) string {
	switch len(f) {
	case 0:
		return "nothing"
	case 1:
		return f[0]
	}
	return strings.Join(f[:len(f)-1], ", ") + " and " + f[len(f)-1]
}

func itoa(n int) string { return strconv.Itoa(n) }

// ordinal returns "2nd", "3rd", "11th".
func ordinal(n int) string {
	suffix := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suffix = "st"
		case 2:
			suffix = "nd"
		case 3:
			suffix = "rd"
		}
	}
	return strconv.Itoa(n) + suffix
}
