//go:build linux

package netdev

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ethtool ioctl interface, from include/uapi/linux/ethtool.h. Every request starts with a u32
// command; the kernel answers in the same buffer (net/ethtool/ioctl.c).
const (
	ethSSFeatures = 4  // ETH_SS_FEATURES in enum ethtool_stringset: the names of the netdev features
	ethGStringLen = 32 // ETH_GSTRING_LEN: bytes per name, NUL-padded (not terminated at full length)

	// struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; }: one count
	// in data per bit set in sset_mask on return.
	ssetInfoSize = 16 + 4 // asking for one set

	// struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[]; }: len names.
	gstringsHeader = 12

	// struct ethtool_gfeatures { u32 cmd; u32 size; struct ethtool_get_features_block features[]; }
	// with struct ethtool_get_features_block { u32 available, requested, active, never_changed; }.
	gfeaturesHeader = 8
	featureBlock    = 16
	activeOffset    = 8 // of the active word within a block

	// maxFeatures bounds the feature count a kernel may claim before it is believed (netdev
	// features are a 64-bit set today).
	maxFeatures = 1 << 12
)

// featureUSO is the ethtool name of NETIF_F_GSO_UDP_L4 (net/ethtool/common.c,
// netdev_features_strings).
const featureUSO = "tx-udp-segmentation"

// udpSegmentation reports whether tx-udp-segmentation is among the named device's active features.
// A kernel that has no such feature name (before 4.18, without UDP GSO) reports false.
func udpSegmentation(name string) (bool, error) {
	names, reply, err := features(name)
	if err != nil {
		return false, err
	}
	bit := slices.Index(names, featureUSO)
	if bit < 0 {
		return false, nil
	}
	return activeBit(reply, bit)
}

// features reads the named device's feature names (ETHTOOL_GSSET_INFO, ETHTOOL_GSTRINGS) and
// feature words (ETHTOOL_GFEATURES). The names are in bit order: bit i of the words is names[i].
func features(name string) (names []string, gfeatures []byte, err error) {
	if len(name) == 0 || len(name) >= unix.IFNAMSIZ {
		return nil, nil, fmt.Errorf("ethtool: invalid interface name %q", name)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ethtool: socket: %w", err)
	}
	defer unix.Close(fd)

	info := make([]byte, ssetInfoSize)
	binary.NativeEndian.PutUint32(info[0:], unix.ETHTOOL_GSSET_INFO)
	binary.NativeEndian.PutUint64(info[8:], 1<<ethSSFeatures)
	if err := ethtool(fd, name, info); err != nil {
		return nil, nil, fmt.Errorf("ethtool: %s: feature count: %w", name, err)
	}
	n, err := parseSsetInfo(info)
	if err != nil {
		return nil, nil, fmt.Errorf("ethtool: %s: %w", name, err)
	}

	// The kernel writes as many names as it has, whatever len says (newer kernels write none
	// when len disagrees), so the buffer holds the count it just gave.
	strs := make([]byte, gstringsHeader+n*ethGStringLen)
	binary.NativeEndian.PutUint32(strs[0:], unix.ETHTOOL_GSTRINGS)
	binary.NativeEndian.PutUint32(strs[4:], ethSSFeatures)
	binary.NativeEndian.PutUint32(strs[8:], uint32(n))
	if err := ethtool(fd, name, strs); err != nil {
		return nil, nil, fmt.Errorf("ethtool: %s: feature names: %w", name, err)
	}
	if names, err = parseStrings(strs, n); err != nil {
		return nil, nil, fmt.Errorf("ethtool: %s: %w", name, err)
	}

	blocks := (n + 31) / 32
	gfeatures = make([]byte, gfeaturesHeader+blocks*featureBlock)
	binary.NativeEndian.PutUint32(gfeatures[0:], unix.ETHTOOL_GFEATURES)
	binary.NativeEndian.PutUint32(gfeatures[4:], uint32(blocks))
	if err := ethtool(fd, name, gfeatures); err != nil {
		return nil, nil, fmt.Errorf("ethtool: %s: features: %w", name, err)
	}
	return names, gfeatures, nil
}

// parseSsetInfo returns the feature count from an ETHTOOL_GSSET_INFO reply that asked for
// ETH_SS_FEATURES alone.
func parseSsetInfo(b []byte) (int, error) {
	if len(b) < ssetInfoSize {
		return 0, errors.New("short string set reply")
	}
	if binary.NativeEndian.Uint64(b[8:])&(1<<ethSSFeatures) == 0 {
		return 0, errors.New("no feature names")
	}
	n := binary.NativeEndian.Uint32(b[16:])
	if n == 0 || n > maxFeatures {
		return 0, fmt.Errorf("implausible feature count %d", n)
	}
	return int(n), nil
}

// parseStrings returns the n names of an ETHTOOL_GSTRINGS reply.
func parseStrings(b []byte, n int) ([]string, error) {
	if len(b) < gstringsHeader {
		return nil, errors.New("short string reply")
	}
	if got := binary.NativeEndian.Uint32(b[8:]); uint64(got) != uint64(n) {
		return nil, fmt.Errorf("feature count changed from %d to %d", n, got)
	}
	data := b[gstringsHeader:]
	if n < 0 || len(data)/ethGStringLen < n {
		return nil, fmt.Errorf("string reply of %d bytes for %d names", len(b), n)
	}
	names := make([]string, n)
	for i := range names {
		s := data[i*ethGStringLen : (i+1)*ethGStringLen]
		if j := bytes.IndexByte(s, 0); j >= 0 {
			s = s[:j]
		}
		names[i] = string(s)
	}
	return names, nil
}

// activeBit reports whether feature bit is set in the active words of an ETHTOOL_GFEATURES reply.
// The kernel puts its own block count in size but writes no more blocks than the buffer asked
// for, so only blocks that both cover are read.
func activeBit(b []byte, bit int) (bool, error) {
	if len(b) < gfeaturesHeader {
		return false, errors.New("short feature reply")
	}
	blocks := min(uint64(binary.NativeEndian.Uint32(b[4:])), uint64((len(b)-gfeaturesHeader)/featureBlock))
	if bit < 0 || uint64(bit/32) >= blocks {
		return false, fmt.Errorf("feature bit %d beyond the %d words the kernel returned", bit, blocks*32)
	}
	word := binary.NativeEndian.Uint32(b[gfeaturesHeader+bit/32*featureBlock+activeOffset:])
	return word&(1<<(bit%32)) != 0, nil
}

// ifreqData is struct ifreq with ifr_data set: the interface name, then a pointer to the request.
// The padding covers the rest of the kernel's union on every ABI.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24]byte
}

// ethtool issues the SIOCETHTOOL ioctl for the named interface on fd with req, which the kernel
// reads and overwrites with its answer.
func ethtool(fd int, name string, req []byte) error {
	if len(req) == 0 {
		return errors.New("empty ethtool request")
	}
	var ifr ifreqData
	copy(ifr.name[:unix.IFNAMSIZ-1], name)
	ifr.data = unsafe.Pointer(&req[0])
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
		if errno == unix.EINTR {
			continue
		}
		runtime.KeepAlive(req)
		runtime.KeepAlive(&ifr)
		if errno != 0 {
			return errno
		}
		return nil
	}
}
