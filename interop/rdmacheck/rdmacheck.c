/* rdmacheck: checks the data of RC verbs against a peer (rxe or goroce), one line per check.
 *
 *   rdmacheck [-m mtu] [-g gid-index] [-p port] [-z max-size] [server-ip]
 *
 * Without server-ip it serves (the responder: memory and receive queue); with it, it connects and is
 * the requester: SEND with immediate, RDMA WRITE, RDMA WRITE with immediate and RDMA READ of 1 B,
 * 4 KiB, 64 KiB and 1 MiB (up to -z), then fetch-and-add and compare-and-swap (a swap and a miss).
 *
 * Out of band, over TCP: each side sends struct info (client first), then the client sends a struct cmd
 * per check, in two phases: PREP (the server sets up its memory and posts its receive) and, after the
 * client's work request completed, VERIFY (the server checks its memory and receive completion). The
 * server answers each with a 32-bit status, 0 for success. All integers are big-endian on TCP.
 *
 * Byte i of the message of check k is (i*31 + k*7 + seed) & 0xff, seed = port & 0xff; the memory a
 * check writes first holds the complement, so every byte written is seen to change, and the byte after
 * the message must keep it. Atomics work on the 8 bytes at the start of the server's buffer, in host
 * byte order as libibverbs defines them. Exits non-zero at the first mismatch. */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <endian.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { OP_DONE, OP_SEND_IMM, OP_WRITE, OP_WRITE_IMM, OP_READ, OP_FETCH_ADD, OP_CMP_SWAP };
enum { PREP, VERIFY };
static const char *opname[] = { "done", "send_imm", "write", "write_imm", "read", "fetch_add", "cmp_swap" };

struct info { uint32_t qpn, psn, rkey, len; uint64_t addr; uint8_t gid[16]; };
/* a: immediate, or the atomic's initial memory; b: compare or addend; c: swap */
struct cmd { uint32_t op, phase, size, k; uint64_t a, b, c; };

#define BUFLEN ((1 << 20) + 8)

static int sock, seed, serving;
static unsigned char *buf;
static struct ibv_mr *mr;
static struct ibv_cq *cq;
static struct ibv_qp *qp;

static void die(const char *m) { perror(m); exit(1); }

/* fail reports the first mismatch; a server tells the client before it exits. */
static void fail(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	printf("rdmacheck: FAIL: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	if (serving) { uint32_t bad = htonl(1); write(sock, &bad, 4); }
	exit(2);
}

static unsigned char pat(uint32_t k, size_t i) { return (i * 31 + k * 7 + seed) & 0xff; }

static void xread(void *p, size_t n) {
	for (size_t got = 0; got < n;) {
		ssize_t r = read(sock, (char *)p + got, n - got);
		if (r <= 0) die("oob read");
		got += r;
	}
}

static void xwrite(const void *p, size_t n) {
	if (write(sock, p, n) != (ssize_t)n) die("oob write");
}

static void send_info(struct info *in) {
	struct info w = { .qpn = htonl(in->qpn), .psn = htonl(in->psn), .rkey = htonl(in->rkey), .len = htonl(in->len), .addr = htobe64(in->addr) };
	memcpy(w.gid, in->gid, 16);
	xwrite(&w, sizeof w);
}

static void recv_info(struct info *in) {
	xread(in, sizeof *in);
	in->qpn = ntohl(in->qpn); in->psn = ntohl(in->psn); in->rkey = ntohl(in->rkey); in->len = ntohl(in->len);
	in->addr = be64toh(in->addr);
}

static void send_cmd(struct cmd *c) {
	struct cmd w = { htonl(c->op), htonl(c->phase), htonl(c->size), htonl(c->k), htobe64(c->a), htobe64(c->b), htobe64(c->c) };
	xwrite(&w, sizeof w);
}

static int recv_cmd(struct cmd *c) {
	xread(c, sizeof *c);
	c->op = ntohl(c->op); c->phase = ntohl(c->phase); c->size = ntohl(c->size); c->k = ntohl(c->k);
	c->a = be64toh(c->a); c->b = be64toh(c->b); c->c = be64toh(c->c);
	return c->op;
}

/* poll waits up to 30 s for one completion and checks its status. */
static struct ibv_wc poll1(const char *what) {
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0) die("ibv_poll_cq");
		if (n == 1) break;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 30) fail("%s: no completion in 30 s", what);
		usleep(20);
	}
	if (wc.status != IBV_WC_SUCCESS) fail("%s: completion status %s", what, ibv_wc_status_str(wc.status));
	return wc;
}

static void fill(uint32_t k, size_t n, int complement) {
	for (size_t i = 0; i < n; i++) buf[i] = pat(k, i) ^ (complement ? 0xff : 0);
}

/* check_data checks that buf holds the message of check k and that the byte after it was not written. */
static void check_data(const char *what, uint32_t k, size_t n) {
	for (size_t i = 0; i < n; i++)
		if (buf[i] != pat(k, i)) fail("%s: byte %zu is 0x%02x, want 0x%02x", what, i, buf[i], pat(k, i));
	if (buf[n] != (pat(k, n) ^ 0xff)) fail("%s: byte %zu after the message was written", what, n);
}

static void post_recv(void) {
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = BUFLEN, .lkey = mr->lkey };
	struct ibv_recv_wr w = { .sg_list = &s, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &w, &bad)) die("ibv_post_recv");
}

static uint64_t mem64(void) { uint64_t v; memcpy(&v, buf, 8); return v; }

/* serve answers the client's commands until it is done; returns the number of checks verified. */
static int serve(void) {
	struct cmd c;
	int n = 0;
	while (recv_cmd(&c) != OP_DONE) {
		uint64_t want;
		struct ibv_wc wc;
		const char *name = c.op < sizeof opname / sizeof *opname ? opname[c.op] : "?";
		if (c.phase == PREP) {
			switch (c.op) {
			case OP_SEND_IMM: case OP_WRITE_IMM: post_recv(); /* fall through */
			case OP_WRITE: fill(c.k, c.size + 1, 1); break;
			case OP_READ: fill(c.k, c.size, 0); break;
			case OP_FETCH_ADD: case OP_CMP_SWAP: memcpy(buf, &c.a, 8); break;
			}
		} else {
			switch (c.op) {
			case OP_SEND_IMM: case OP_WRITE_IMM:
				wc = poll1(name);
				if (wc.opcode != (c.op == OP_SEND_IMM ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM) || !(wc.wc_flags & IBV_WC_WITH_IMM))
					fail("%s: receive completion opcode %d flags 0x%x", name, wc.opcode, wc.wc_flags);
				if (ntohl(wc.imm_data) != c.a) fail("%s: immediate 0x%08x, want 0x%08x", name, ntohl(wc.imm_data), (uint32_t)c.a);
				if (wc.byte_len != c.size) fail("%s: byte_len %u, want %u", name, wc.byte_len, c.size);
				/* fall through */
			case OP_WRITE: check_data(name, c.k, c.size); break;
			case OP_READ:
				for (size_t i = 0; i < c.size; i++)
					if (buf[i] != pat(c.k, i)) fail("read: served memory changed at byte %zu", i);
				break;
			case OP_FETCH_ADD: case OP_CMP_SWAP:
				want = c.op == OP_FETCH_ADD ? c.a + c.b : c.a == c.b ? c.c : c.a;
				if (mem64() != want) fail("%s: memory 0x%016llx, want 0x%016llx", name, (unsigned long long)mem64(), (unsigned long long)want);
				break;
			}
			printf("rdmacheck: server %s size %u: ok\n", name, c.size);
			n++;
		}
		uint32_t ok = 0;
		xwrite(&ok, 4);
	}
	return n;
}

/* check runs one check as the client: PREP, the work request, VERIFY. */
static void check(struct info *peer, struct cmd c) {
	const char *name = opname[c.op];
	uint32_t status;
	c.phase = PREP;
	send_cmd(&c);
	xread(&status, 4);
	if (status) fail("%s: the server failed to prepare", name);

	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = c.size, .lkey = mr->lkey };
	struct ibv_send_wr w = { .sg_list = &s, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = peer->addr; w.wr.rdma.rkey = peer->rkey;
	switch (c.op) {
	case OP_SEND_IMM: w.opcode = IBV_WR_SEND_WITH_IMM; w.imm_data = htonl(c.a); fill(c.k, c.size, 0); break;
	case OP_WRITE: w.opcode = IBV_WR_RDMA_WRITE; fill(c.k, c.size, 0); break;
	case OP_WRITE_IMM: w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; w.imm_data = htonl(c.a); fill(c.k, c.size, 0); break;
	case OP_READ: w.opcode = IBV_WR_RDMA_READ; fill(c.k, c.size + 1, 1); break;
	case OP_FETCH_ADD: case OP_CMP_SWAP:
		w.opcode = c.op == OP_FETCH_ADD ? IBV_WR_ATOMIC_FETCH_AND_ADD : IBV_WR_ATOMIC_CMP_AND_SWP;
		w.wr.atomic.remote_addr = peer->addr; w.wr.atomic.rkey = peer->rkey;
		w.wr.atomic.compare_add = c.b; w.wr.atomic.swap = c.c;
		memset(buf, 0, 8);
		break;
	}
	if (ibv_post_send(qp, &w, &bad)) die("ibv_post_send");
	poll1(name);
	if (c.op == OP_READ) check_data(name, c.k, c.size);
	if ((c.op == OP_FETCH_ADD || c.op == OP_CMP_SWAP) && mem64() != c.a)
		fail("%s: original value 0x%016llx, want 0x%016llx", name, (unsigned long long)mem64(), (unsigned long long)c.a);

	c.phase = VERIFY;
	send_cmd(&c);
	xread(&status, 4);
	if (status) fail("%s size %u: the server found its memory or completion wrong", name, c.size);
	printf("rdmacheck: client %s size %u: ok\n", name, c.size);
}

static int run_client(struct info *peer, uint32_t maxsize) {
	static const uint32_t sizes[] = { 1, 4096, 65536, 1 << 20 };
	uint32_t k = 0;
	int n = 0;
	for (int i = 0; i < 4 && sizes[i] <= maxsize; i++)
		for (uint32_t op = OP_SEND_IMM; op <= OP_READ; op++, k++, n++)
			check(peer, (struct cmd){ .op = op, .size = sizes[i], .k = k, .a = 0x5eed0000 + k });
	/* a carry across the 32-bit halves; a compare that matches, and one that does not */
	check(peer, (struct cmd){ .op = OP_FETCH_ADD, .size = 8, .k = k++, .a = 0x01234567fffffff0ull, .b = 0x31 });
	check(peer, (struct cmd){ .op = OP_CMP_SWAP, .size = 8, .k = k++, .a = 0x0a0b0c0d01020304ull, .b = 0x0a0b0c0d01020304ull, .c = 0xfedcba9876543210ull });
	check(peer, (struct cmd){ .op = OP_CMP_SWAP, .size = 8, .k = k++, .a = 0x0a0b0c0d01020304ull, .b = 0x0a0b0c0d01020305ull, .c = 0xfedcba9876543210ull });
	send_cmd(&(struct cmd){ .op = OP_DONE });
	return n + 3;
}

static int oob(const char *host, int port) {
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (host) {
		if (inet_pton(AF_INET, host, &a.sin_addr) != 1) die("server-ip");
		for (int i = 0; i < 100; i++) { if (!connect(s, (void *)&a, sizeof a)) return s; usleep(100000); }
		die("connect");
	}
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(s, (void *)&a, sizeof a) || listen(s, 1)) die("listen");
	int c = accept(s, NULL, NULL);
	close(s);
	return c;
}

int main(int argc, char **argv) {
	int mtu = 1024, gidx = 1, port = 18400, opt;
	uint32_t maxsize = 1 << 20;
	while ((opt = getopt(argc, argv, "m:g:p:z:")) != -1) {
		if (opt == 'm') mtu = atoi(optarg);
		else if (opt == 'g') gidx = atoi(optarg);
		else if (opt == 'p') port = atoi(optarg);
		else if (opt == 'z') maxsize = atoi(optarg);
		else { fprintf(stderr, "usage: rdmacheck [-m mtu] [-g gid-index] [-p port] [-z max-size] [server-ip]\n"); return 1; }
	}
	const char *host = optind < argc ? argv[optind] : NULL;
	seed = port & 0xff;
	enum ibv_mtu pmtu = mtu == 4096 ? IBV_MTU_4096 : mtu == 2048 ? IBV_MTU_2048 : mtu == 512 ? IBV_MTU_512 : IBV_MTU_1024;

	struct ibv_device **dl = ibv_get_device_list(NULL);
	if (!dl || !dl[0]) die("no RDMA device");
	struct ibv_context *ctx = ibv_open_device(dl[0]);
	if (!ctx) die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, (BUFLEN + 4095) & ~4095);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	mr = pd && buf ? ibv_reg_mr(pd, buf, BUFLEN, access) : NULL;
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	qp = mr && cq ? ibv_create_qp(pd, &ia) : NULL;
	if (!qp) die("setup");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access & ~IBV_ACCESS_LOCAL_WRITE };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");

	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) die("ibv_query_gid");
	srand48(getpid() ^ time(NULL));
	struct info me = { .qpn = qp->qp_num, .psn = lrand48() & 0xffffff, .rkey = mr->rkey, .len = BUFLEN, .addr = (uintptr_t)buf }, peer;
	memcpy(me.gid, gid.raw, 16);
	sock = oob(host, port);
	if (host) { send_info(&me); recv_info(&peer); }
	else { recv_info(&peer); send_info(&me); }
	printf("rdmacheck: %s, path MTU %d: local QPN 0x%06x PSN 0x%06x, remote QPN 0x%06x PSN 0x%06x rkey 0x%x addr 0x%llx len %u\n",
	       host ? "client" : "server", mtu, me.qpn, me.psn, peer.qpn, peer.psn, peer.rkey, (unsigned long long)peer.addr, peer.len);
	if (host && peer.len < BUFLEN) fail("server buffer of %u bytes, want %u", peer.len, BUFLEN);

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = pmtu; a.dest_qp_num = peer.qpn; a.rq_psn = peer.psn;
	a.max_dest_rd_atomic = 16; a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1; a.ah_attr.port_num = 1; a.ah_attr.grh.hop_limit = 64; a.ah_attr.grh.sgid_index = gidx;
	memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
	                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) die("RTR");
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = me.psn; a.max_rd_atomic = 16;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
	                  IBV_QP_MAX_QP_RD_ATOMIC)) die("RTS");
	/* both sides are in RTS before the first command */
	char c = 'r';
	xwrite(&c, 1);
	xread(&c, 1);

	serving = !host;
	int n = host ? run_client(&peer, maxsize) : serve();
	printf("rdmacheck: %d checks passed\n", n);
	return 0;
}
