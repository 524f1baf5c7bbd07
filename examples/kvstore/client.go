package kvstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/goroce/goroce"
)

// Client reads and writes a server's table with one-sided RDMA over its own queue pair. Its methods
// are safe for concurrent use and run one at a time; for parallel requests, use several Clients (they
// may share a Device).
type Client struct {
	table tableInfo // set by NewClient, read-only after
	conn  net.Conn

	// mu guards every field below. The device writes buf only while a request that names it is
	// outstanding, and a method reads buf only after the request's completion.
	mu          sync.Mutex
	pd          *goroce.PD
	cq          *goroce.CQ
	qp          *goroce.QP
	buf         *goroce.MR          // see the offsets below
	wc          []goroce.Completion // room for Wait
	outstanding int                 // requests posted whose completions are not yet reaped
	err         error               // what broke the queue pair, returned by every call after
	closed      bool
	stats       Stats
}

// Stats count a client's work.
type Stats struct {
	Gets, Puts  uint64
	ReadRetries uint64 // slot copies dropped: a writer held the slot, or wrote it while it was read
	LockRetries uint64 // compare-and-swaps lost to another writer
}

// The client's buffer: a slot copy, the version read after it, an atomic's original value, and the
// body of a Put (the slot from its checksum on).
func (c *Client) copyAt() int    { return 0 }
func (c *Client) versionAt() int { return c.table.slotSize() }
func (c *Client) atomicAt() int  { return c.versionAt() + wordSize }
func (c *Client) bodyAt() int    { return c.atomicAt() + wordSize }

// NewClient connects to the server at the other end of conn, with a queue pair on dev. opts are the
// queue pair's options (nil: goroce.DefaultConnectOptions). The Client keeps conn open: the server
// keeps the client's queue pair until conn closes. Close closes it, and so does NewClient if it fails
// or ctx ends during the setup.
func NewClient(ctx context.Context, dev *goroce.Device, conn net.Conn, opts *goroce.ConnectOptions) (*Client, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	c := &Client{conn: conn}
	var err error
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if c.cq, err = dev.CreateCQ(4); err != nil {
		return nil, c.fail(err)
	}
	if c.qp, err = c.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: 4}); err != nil {
		return nil, c.fail(err)
	}
	c.wc = make([]goroce.Completion, 4)
	if err := writeHello(conn, c.qp.Endpoint()); err != nil {
		return nil, c.fail(fmt.Errorf("kvstore: sending hello: %w", err))
	}
	if c.table, err = readTable(conn); err != nil {
		return nil, c.fail(fmt.Errorf("kvstore: reading the table: %w", err))
	}
	if c.buf, err = c.pd.AllocMR(c.bodyAt()+c.table.slotSize(), goroce.LocalWrite); err != nil {
		return nil, c.fail(err)
	}
	if err := c.qp.Connect(c.table.peer, opts); err != nil {
		return nil, c.fail(err)
	}
	return c, nil
}

// fail closes what NewClient opened and returns err.
func (c *Client) fail(err error) error {
	c.conn.Close()
	if c.buf != nil {
		c.buf.Close()
	}
	if c.qp != nil {
		c.qp.Close()
	}
	if c.cq != nil {
		c.cq.Close()
	}
	c.pd.Close()
	return err
}

// Close closes the client's queue pair and its connection, after which the server destroys its end.
// A request still outstanding (one whose context ended) is flushed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return errors.Join(c.qp.Close(), c.buf.Close(), c.cq.Close(), c.pd.Close(), c.conn.Close())
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Get returns the value of key, or ErrNotFound. It retries a slot while a writer is at work on it (see
// the package doc), until ctx ends.
func (c *Client) Get(ctx context.Context, key []byte) ([]byte, error) {
	if len(key) == 0 || len(key) > c.table.MaxKey {
		return nil, ErrKeyLength
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Gets++
	h := hashKey(key)
	for i := range c.table.Probes {
		s, err := c.read(ctx, c.table.probe(h, i))
		if err != nil {
			return nil, err
		}
		if s.version == 0 {
			return nil, ErrNotFound // an empty slot ends the probe sequence
		}
		if bytes.Equal(s.key, key) {
			return bytes.Clone(s.value), nil
		}
	}
	return nil, ErrNotFound
}

// Put sets the value of key. It returns ErrTableFull if every slot of the key's probe sequence holds
// another key.
//
// Put honours ctx until its compare-and-swap may have locked the slot; from then on it finishes the
// write and the release, which the slot's readers and writers wait for. That takes a round trip or
// two, or, if the server is gone, until the queue pair's retry limits run out (ConnectOptions.Timeout
// and RetryCnt).
func (c *Client) Put(ctx context.Context, key, value []byte) error {
	if len(key) == 0 || len(key) > c.table.MaxKey {
		return ErrKeyLength
	}
	if len(value) > c.table.MaxValue {
		return ErrValueTooLarge
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Puts++
	h := hashKey(key)
	for i := 0; i < c.table.Probes; {
		slot := c.table.probe(h, i)
		s, err := c.read(ctx, slot)
		if err != nil {
			return err
		}
		if s.version != 0 && !bytes.Equal(s.key, key) {
			i++ // another key's slot
			continue
		}
		locked, err := c.lock(ctx, slot, s.version)
		if err != nil {
			return err
		}
		if !locked {
			c.stats.LockRetries++
			continue // the slot changed since it was read: read it again
		}
		return c.write(context.WithoutCancel(ctx), slot, s.version+2, key, value)
	}
	return ErrTableFull
}

// snapshot is a consistent copy of a slot. key and value point into the client's buffer.
type snapshot struct {
	version    uint64
	key, value []byte
}

// read returns a consistent copy of a slot: an RDMA READ of the slot and one of its version word,
// posted together, until the two versions agree, are even, and the checksum holds.
func (c *Client) read(ctx context.Context, slot int) (snapshot, error) {
	size := c.table.slotSize()
	addr := c.table.addr + uint64(slot*size)
	for {
		err := c.run(ctx,
			&goroce.SendWR{Opcode: goroce.WRRDMARead, Flags: goroce.Signaled,
				SGL: []goroce.SGE{c.buf.SGE(c.copyAt(), size)}, RemoteAddr: addr, RKey: c.table.rkey},
			&goroce.SendWR{Opcode: goroce.WRRDMARead, Flags: goroce.Signaled,
				SGL: []goroce.SGE{c.buf.SGE(c.versionAt(), wordSize)}, RemoteAddr: addr + offVersion, RKey: c.table.rkey},
		)
		if err != nil {
			return snapshot{}, err
		}
		b := c.buf.Bytes()
		if s, ok := c.decode(b[c.copyAt():c.copyAt()+size], c.table.order.Uint64(b[c.versionAt():])); ok {
			return s, nil
		}
		c.stats.ReadRetries++
		if err := ctx.Err(); err != nil {
			return snapshot{}, err
		}
	}
}

// decode checks a slot copy against the version read after it and returns its contents.
func (c *Client) decode(b []byte, after uint64) (snapshot, bool) {
	v := c.table.order.Uint64(b[offVersion:])
	if v != after || v%2 != 0 {
		return snapshot{}, false // a writer held the slot, or took it during the copy
	}
	if v == 0 {
		return snapshot{}, true // never written
	}
	kl := int(binary.LittleEndian.Uint16(b[offKeyLen:]))
	vl := int(binary.LittleEndian.Uint32(b[offValueLen:]))
	if kl == 0 || kl > c.table.MaxKey || vl > c.table.MaxValue {
		return snapshot{}, false // torn: bytes from before the write that released v
	}
	s := snapshot{version: v, key: b[offKey : offKey+kl], value: b[offKey+c.table.MaxKey:][:vl]}
	if checksum(v, s.key, s.value) != binary.LittleEndian.Uint64(b[offChecksum:]) {
		return snapshot{}, false // torn, as above
	}
	return s, true
}

// lock runs compare-and-swap of version to version+1 on a slot's version word and reports whether it
// swapped. Once it is posted, it waits for the completion whatever ctx says: an abandoned swap that
// succeeded would leave the slot locked for good.
func (c *Client) lock(ctx context.Context, slot int, version uint64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	err := c.run(context.WithoutCancel(ctx), &goroce.SendWR{Opcode: goroce.WRCompareSwap, Flags: goroce.Signaled,
		CompareAdd: version, Swap: version + 1, SGL: []goroce.SGE{c.buf.SGE(c.atomicAt(), wordSize)},
		RemoteAddr: c.table.addr + uint64(slot*c.table.slotSize()) + offVersion, RKey: c.table.rkey})
	if err != nil {
		return false, err
	}
	// The original value comes back in this host's byte order.
	return binary.NativeEndian.Uint64(c.buf.Bytes()[c.atomicAt():]) == version, nil
}

// write fills a slot this client holds and releases it at version: an RDMA WRITE of the body and,
// behind it, a fetch-and-add of 1 on the version word, posted together.
func (c *Client) write(ctx context.Context, slot int, version uint64, key, value []byte) error {
	body := c.buf.Bytes()[c.bodyAt():]
	field := func(off int) []byte { return body[off-offChecksum:] } // body starts at the checksum
	binary.LittleEndian.PutUint64(field(offChecksum), checksum(version, key, value))
	binary.LittleEndian.PutUint16(field(offKeyLen), uint16(len(key)))
	binary.LittleEndian.PutUint16(field(offKeyLen+2), 0)
	binary.LittleEndian.PutUint32(field(offValueLen), uint32(len(value)))
	copy(field(offKey), key)
	copy(field(offKey+c.table.MaxKey), value)
	n := offKey + c.table.MaxKey + len(value) - offChecksum
	addr := c.table.addr + uint64(slot*c.table.slotSize())
	return c.run(ctx,
		&goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
			SGL: []goroce.SGE{c.buf.SGE(c.bodyAt(), n)}, RemoteAddr: addr + offChecksum, RKey: c.table.rkey},
		&goroce.SendWR{Opcode: goroce.WRFetchAdd, Flags: goroce.Signaled, CompareAdd: 1,
			SGL: []goroce.SGE{c.buf.SGE(c.atomicAt(), wordSize)}, RemoteAddr: addr + offVersion, RKey: c.table.rkey},
	)
}

// run posts wrs, every one signaled, and waits for their completions. If ctx ends first it returns
// ctx's error, and the next call reaps what is still outstanding before it posts anything, so that a
// late completion or a late write into buf cannot be mistaken for its own. A failed request breaks the
// client: its error is returned now and by every call after.
func (c *Client) run(ctx context.Context, wrs ...*goroce.SendWR) error {
	if c.closed {
		return ErrClosed
	}
	if err := c.reap(ctx); err != nil {
		return err
	}
	if err := c.qp.PostSend(wrs...); err != nil {
		if pe := (*goroce.PostError)(nil); errors.As(err, &pe) {
			c.outstanding += pe.Index
		}
		c.err = fmt.Errorf("kvstore: posting: %w", err)
		return c.err
	}
	c.outstanding += len(wrs)
	return c.reap(ctx)
}

// reap waits for the outstanding requests' completions.
func (c *Client) reap(ctx context.Context) error {
	for c.outstanding > 0 && c.err == nil {
		n, err := c.cq.Wait(ctx, c.wc)
		if err != nil {
			return err
		}
		c.outstanding -= n
		for _, wc := range c.wc[:n] {
			if err := wc.Err(); err != nil && c.err == nil {
				c.err = fmt.Errorf("kvstore: %w", err)
			}
		}
	}
	return c.err
}
