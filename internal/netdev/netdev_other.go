//go:build !linux

package netdev

import (
	"errors"
	"fmt"
	"net/netip"
)

// Egress is only implemented on Linux; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func Egress(dst netip.Addr) (Device, error) {
	return Device{}, fmt.Errorf("netdev: egress device for %v: %w", dst, errors.ErrUnsupported)
}
