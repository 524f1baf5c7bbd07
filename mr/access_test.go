package mr

import (
	"errors"
	"testing"
)

func TestAccessString(t *testing.T) {
	for _, tc := range []struct {
		a    Access
		want string
	}{
		{0, "None"},
		{LocalWrite, "LocalWrite"},
		{LocalWrite | RemoteRead, "LocalWrite|RemoteRead"},
		{allRemote | MWBind, "LocalWrite|RemoteWrite|RemoteRead|RemoteAtomic|MWBind"},
		{RemoteRead | 0x40, "RemoteRead|0x40"},
	} {
		if got := tc.a.String(); got != tc.want {
			t.Errorf("Access(%#x).String() = %q, want %q", uint32(tc.a), got, tc.want)
		}
	}
}

// TestAccessValues pins the libibverbs values of enum ibv_access_flags.
func TestAccessValues(t *testing.T) {
	if LocalWrite != 1 || RemoteWrite != 2 || RemoteRead != 4 || RemoteAtomic != 8 || MWBind != 16 {
		t.Fatal("access bits differ from IBV_ACCESS_*")
	}
}

func TestRegisterAccessValidation(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	for _, tc := range []struct {
		a    Access
		want error
	}{
		{0, nil},
		{RemoteRead, nil},
		{LocalWrite, nil},
		{LocalWrite | RemoteWrite, nil},
		{LocalWrite | RemoteAtomic, nil},
		{allRemote | MWBind, nil},
		{RemoteWrite, ErrInvalidAccess},
		{RemoteAtomic, ErrInvalidAccess},
		{RemoteWrite | RemoteRead, ErrInvalidAccess},
		{RemoteAtomic | RemoteRead | MWBind, ErrInvalidAccess},
		{LocalWrite | 1<<5, ErrUnknownAccess},
	} {
		r, err := tb.Register(pd, make([]byte, 16), tc.a)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("Register(%v) = %v, want %v", tc.a, err, tc.want)
			continue
		}
		if err == nil && r.Access() != tc.a {
			t.Errorf("Register(%v).Access() = %v", tc.a, r.Access())
		}
		if _, err := tb.Alloc(pd, 16, tc.a); tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("Alloc(%v) = %v, want %v", tc.a, err, tc.want)
		}
	}
}
