package qp

import (
	"reflect"
	"testing"

	"github.com/goroce/goroce/mr"
)

// TestSendRingCopiesEveryField fills every field of a SendWR with a value other than its zero and
// checks that the ring's copy holds them all: push copies the fields one by one (so that the
// caller's slices do not escape), and a field added to SendWR must be added there.
func TestSendRingCopiesEveryField(t *testing.T) {
	wr := SendWR{SGL: []mr.SGE{{Addr: 1, Length: 8, LKey: 2}}, AH: &AddressHandle{Port: 9}}
	v := reflect.ValueOf(&wr).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(uint64(i + 1))
		case reflect.Slice, reflect.Pointer:
		default:
			t.Fatalf("SendWR.%s: a field of kind %v the test does not fill", v.Type().Field(i).Name, f.Kind())
		}
	}
	wr.Opcode, wr.Flags = WRSend, 0
	r := newSendRing(4, 2, 64)
	w, err := r.push(&wr, UD)
	if err != nil {
		t.Fatal(err)
	}
	got, want := w.wr, wr
	if !reflect.DeepEqual(got.SGL, want.SGL) || got.AH == nil || *got.AH != *want.AH || got.AH == want.AH {
		t.Errorf("SGL %v, AH %v: want a copy of %v, %v", got.SGL, got.AH, want.SGL, *want.AH)
	}
	got.SGL, got.AH, want.SGL, want.AH = nil, nil, nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the ring holds %+v, want %+v", got, want)
	}
}

// TestPostSendDoesNotAllocate posts a work request built on the stack, as an API layer does for each
// post: it must not escape.
func TestPostSendDoesNotAllocate(t *testing.T) {
	r := newSendRing(4, 2, 64)
	inline := []byte("ping")
	n := testing.AllocsPerRun(100, func() {
		var sgl [1]mr.SGE
		sgl[0] = mr.SGE{Addr: 1, Length: 8}
		ah := AddressHandle{Port: 4791}
		wr := SendWR{Opcode: WRSend, SGL: sgl[:], AH: &ah}
		if _, err := r.push(&wr, RC); err != nil {
			t.Fatal(err)
		}
		r.unpush()
		wr = SendWR{Opcode: WRSend, Flags: Inline, InlineData: inline}
		if _, err := r.push(&wr, RC); err != nil {
			t.Fatal(err)
		}
		r.unpush()
	})
	if n != 0 {
		t.Errorf("%v allocations per push", n)
	}
}
