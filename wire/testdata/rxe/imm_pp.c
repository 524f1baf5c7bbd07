/* imm_pp: tiny libibverbs RC test for golden captures.
 * usage: imm_pp [-g gidx] [-m mode] [server-ip]
 * modes: imm  - client posts SEND_WITH_IMM 61B (solicited), SEND_WITH_IMM 2500B,
 *               RDMA_WRITE_WITH_IMM 62B, RDMA_WRITE_WITH_IMM 2501B (solicited) (path MTU 1024)
 *        rnr  - server delays posting its receive by 300 ms; client SEND 64B -> RNR NAKs
 *        nak  - client RDMA_WRITE 64B with a wrong rkey -> NAK remote access error
 * OOB: TCP 18600, struct exchange, client first. */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>

struct info { uint32_t qpn, psn, rkey; uint64_t addr; uint8_t gid[16]; };

static void die(const char *m) { perror(m); exit(1); }

static int oob(const char *host) {
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(18600) };
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (host) {
		inet_pton(AF_INET, host, &a.sin_addr);
		for (int i = 0; i < 50; i++) { if (!connect(s, (void *)&a, sizeof a)) return s; usleep(100000); }
		die("connect");
	}
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(s, (void *)&a, sizeof a) || listen(s, 1)) die("bind");
	int c = accept(s, NULL, NULL);
	close(s);
	return c;
}

static void xfer(int s, int client, struct info *me, struct info *peer) {
	if (client) { write(s, me, sizeof *me); if (read(s, peer, sizeof *peer) != sizeof *peer) die("read"); }
	else { if (read(s, peer, sizeof *peer) != sizeof *peer) die("read"); write(s, me, sizeof *me); }
}

static void poll1(struct ibv_cq *cq, const char *who) {
	struct ibv_wc wc;
	int n;
	for (int i = 0; i < 30000000; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0) die("poll");
		if (n == 1) {
			printf("%s: wc status=%s(%d) opcode=%d byte_len=%u imm=%s0x%08x wc_flags=0x%x\n", who,
			       ibv_wc_status_str(wc.status), wc.status, wc.opcode, wc.byte_len,
			       (wc.wc_flags & IBV_WC_WITH_IMM) ? "" : "(none)", ntohl(wc.imm_data), wc.wc_flags);
			return;
		}
		usleep(10);
	}
	fprintf(stderr, "%s: poll timeout\n", who);
	exit(2);
}

int main(int argc, char **argv) {
	int gidx = 1, opt;
	const char *mode = "imm";
	while ((opt = getopt(argc, argv, "g:m:")) != -1) {
		if (opt == 'g') gidx = atoi(optarg);
		else if (opt == 'm') mode = optarg;
	}
	const char *host = optind < argc ? argv[optind] : NULL;
	int client = host != NULL;

	struct ibv_device **dl = ibv_get_device_list(NULL);
	if (!dl || !dl[0]) die("no device");
	struct ibv_context *ctx = ibv_open_device(dl[0]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	size_t len = 16384;
	char *buf = aligned_alloc(4096, len);
	for (size_t i = 0; i < len; i++) buf[i] = (char)(client ? 0x40 + i % 26 : 0x61 + i % 26);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!pd || !mr || !cq || !qp) die("setup");

	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("init");

	int delay_recv = !client && !strcmp(mode, "rnr");
	int nrecv = !strcmp(mode, "imm") ? 4 : !strcmp(mode, "rnr") ? 1 : 0;
	struct ibv_sge rs = { .addr = (uintptr_t)buf, .length = 8192, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .sg_list = &rs, .num_sge = 1 }, *brw;
	if (!client && !delay_recv)
		for (int i = 0; i < nrecv; i++) { rw.wr_id = i; if (ibv_post_recv(qp, &rw, &brw)) die("post_recv"); }

	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) die("gid");
	srand48(getpid() * time(NULL));
	struct info me = { .qpn = qp->qp_num, .psn = lrand48() & 0xffffff, .rkey = mr->rkey, .addr = (uintptr_t)buf }, peer;
	memcpy(me.gid, gid.raw, 16);
	int s = oob(host);
	xfer(s, client, &me, &peer);
	printf("%s: local qpn 0x%x psn 0x%x rkey 0x%x; remote qpn 0x%x psn 0x%x rkey 0x%x addr 0x%llx\n", client ? "client" : "server",
	       me.qpn, me.psn, me.rkey, peer.qpn, peer.psn, peer.rkey, (unsigned long long)peer.addr);

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = peer.qpn; a.rq_psn = peer.psn;
	a.max_dest_rd_atomic = 1; a.min_rnr_timer = 20; /* 10.24 ms */
	a.ah_attr.is_global = 1; a.ah_attr.port_num = 1; a.ah_attr.grh.hop_limit = 1; a.ah_attr.grh.sgid_index = gidx;
	memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
	                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) die("rtr");
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = me.psn; a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
	                  IBV_QP_MAX_QP_RD_ATOMIC)) die("rts");
	char c = 0;
	/* barrier: both sides in RTS */
	write(s, "r", 1); if (read(s, &c, 1) != 1) die("barrier");

	if (!client) {
		if (delay_recv) {
			usleep(300000);
			if (ibv_post_recv(qp, &rw, &brw)) die("post_recv");
			printf("server: posted receive after 300 ms\n");
		}
		for (int i = 0; i < nrecv; i++) poll1(cq, "server");
		if (!strcmp(mode, "imm"))
			printf("server: buf[4096..4100]=%.4s buf[4096+2496..]=%.4s\n", buf + 4096, buf + 4096 + 2496);
		write(s, "d", 1); read(s, &c, 1);
		return 0;
	}

	struct ibv_sge ss = { .addr = (uintptr_t)buf, .lkey = mr->lkey };
	struct ibv_send_wr w = { .sg_list = &ss, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED }, *bw;
	struct { enum ibv_wr_opcode op; uint32_t len; uint32_t imm; int flags; uint32_t roff; } plan_imm[] = {
		{ IBV_WR_SEND_WITH_IMM, 61, 0x11223344, IBV_SEND_SOLICITED, 0 },
		{ IBV_WR_SEND_WITH_IMM, 2500, 0x55667788, 0, 0 },
		{ IBV_WR_RDMA_WRITE_WITH_IMM, 62, 0x99aabbcc, 0, 4096 },
		{ IBV_WR_RDMA_WRITE_WITH_IMM, 2501, 0xddeeff00, IBV_SEND_SOLICITED, 4096 },
	}, plan_rnr[] = { { IBV_WR_SEND, 64, 0, 0, 0 } }, plan_nak[] = { { IBV_WR_RDMA_WRITE, 64, 0, 0, 0 } }, *plan;
	int np;
	if (!strcmp(mode, "imm")) { plan = plan_imm; np = 4; }
	else if (!strcmp(mode, "rnr")) { plan = plan_rnr; np = 1; }
	else { plan = plan_nak; np = 1; }
	for (int i = 0; i < np; i++) {
		w.wr_id = i; w.opcode = plan[i].op; ss.length = plan[i].len; w.imm_data = htonl(plan[i].imm);
		w.send_flags = IBV_SEND_SIGNALED | plan[i].flags;
		w.wr.rdma.remote_addr = peer.addr + plan[i].roff;
		w.wr.rdma.rkey = !strcmp(mode, "nak") ? peer.rkey ^ 0x5a5a00 : peer.rkey;
		if (ibv_post_send(qp, &w, &bw)) die("post_send");
		poll1(cq, "client");   /* one at a time: keeps the capture easy to read */
	}
	if (!strcmp(mode, "nak")) { write(s, "d", 1); }
	else { if (read(s, &c, 1) != 1) die("done"); write(s, "d", 1); }
	return 0;
}
