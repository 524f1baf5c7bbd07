#!/usr/bin/env python3
"""ICRC check (IPv4 + IPv6) and opcode census for RoCEv2 pcaps."""
import collections, struct, sys, zlib
OPS = {0:"SEND_FIRST",1:"SEND_MIDDLE",2:"SEND_LAST",3:"SEND_LAST_IMM",4:"SEND_ONLY",5:"SEND_ONLY_IMM",
 6:"WRITE_FIRST",7:"WRITE_MIDDLE",8:"WRITE_LAST",9:"WRITE_LAST_IMM",10:"WRITE_ONLY",11:"WRITE_ONLY_IMM",
 12:"READ_REQ",13:"READ_RESP_FIRST",14:"READ_RESP_MIDDLE",15:"READ_RESP_LAST",16:"READ_RESP_ONLY",
 17:"ACK",18:"ATOMIC_ACK",19:"CMP_SWAP",20:"FETCH_ADD",22:"SEND_LAST_INV",23:"SEND_ONLY_INV"}
PFX = {0:"RC",1:"UC",2:"RD",3:"UD",5:"XRC"}
def opname(o): return f"{PFX.get(o>>5,'?')} {OPS.get(o&0x1f,o&0x1f)} (0x{o:02x})"
def read_pcap(path):
    data = open(path,"rb").read()
    e = "<" if struct.unpack("<I",data[:4])[0] in (0xa1b2c3d4,0xa1b23c4d) else ">"
    off = 24
    while off+16 <= len(data):
        ts, tu, incl, orig = struct.unpack(e+"IIII", data[off:off+16]); off += 16
        yield data[off:off+incl], orig; off += incl
def aeth_str(a):
    s = a >> 29 & 3; v = a >> 24 & 0x1f
    return {0:f"ACK credits={v}",1:f"RNR_NAK timer={v}",3:f"NAK code={v}"}.get(s, f"rsvd{s}") + f" msn={a&0xffffff}"
def main():
    verbose = "-v" in sys.argv
    bad_total = 0
    for path in [a for a in sys.argv[1:] if a != "-v"]:
        ops = collections.Counter(); extra = collections.Counter(); n = ok = 0; lines = []
        for pkt, orig in read_pcap(path):
            if len(pkt) < orig: extra["TRUNCATED"] += 1; continue
            et = struct.unpack(">H", pkt[12:14])[0]
            if et == 0x0800:
                ihl = (pkt[14]&15)*4; ip = bytearray(pkt[14:14+ihl])
                if ip[9] != 17: continue
                end = 14 + struct.unpack(">H", ip[2:4])[0]; l4 = 14+ihl
                ip[1] = 0xff; ip[8] = 0xff; ip[10:12] = b"\xff\xff"
                fam = "v4"; fl = None; src = ".".join(map(str,pkt[26:30])); dst = ".".join(map(str,pkt[30:34]))
            elif et == 0x86dd:
                ip = bytearray(pkt[14:54])
                if ip[6] != 17: continue
                end = 54 + struct.unpack(">H", ip[4:6])[0]; l4 = 54
                fl = struct.unpack(">I", ip[0:4])[0]; tc = fl >> 20 & 0xff; fl &= 0xfffff
                extra[f"v6 tc={tc} hlim={ip[7]}"] += 1
                ip[0] |= 0x0f; ip[1:4] = b"\xff\xff\xff"; ip[7] = 0xff
                fam = "v6"; src = pkt[22:38].hex(); dst = pkt[38:54].hex()
            else: continue
            udp = bytearray(pkt[l4:l4+8]); sport, dport, ulen, csum = struct.unpack(">HHHH", udp)
            if dport != 4791: continue
            ib = bytearray(pkt[l4+8:end]); n += 1
            icrc = ib[-4:]; body = bytearray(ib[:-4]); orig_b4 = body[4]; body[4] = 0xff
            crc = zlib.crc32(b"\xff"*8 + bytes(ip) + bytes(udp[:6]) + b"\xff\xff" + bytes(body))
            good = struct.pack("<I", crc) == bytes(icrc); ok += good
            op = ib[0]; se = ib[1] >> 7 & 1; mig = ib[1]>>6&1; pad = ib[1] >> 4 & 3; tver = ib[1]&15
            dqp = struct.unpack(">I", ib[4:8])[0] & 0xffffff; ack = ib[8] >> 7; psn = struct.unpack(">I", ib[8:12])[0] & 0xffffff
            ops[opname(op)] += 1
            extra[f"udp_csum={csum:#06x}"] += 1; extra[f"{fam} resv8a={orig_b4}"] += 1; extra[f"pkey={ib[2]:02x}{ib[3]:02x}"] += 1
            extra[f"sport={sport:#06x} {src[-8:]}->dqp {dqp:#x}" + (f" fl={fl:#07x}" if fl is not None else "")] += 1
            info = ""
            rest = ib[12:-4]; low = op & 0x1f; svc = op >> 5
            if svc == 3: info += f" DETH qkey={struct.unpack('>I',rest[:4])[0]:#x} sqp={struct.unpack('>I',rest[4:8])[0]&0xffffff:#x}"; rest = rest[8:]
            if low in (6,10,11,12):
                va, rk, ln = struct.unpack(">QII", rest[:16]); info += f" RETH va={va:#x} rkey={rk:#x} len={ln}"; rest = rest[16:]
            if low in (19,20):
                va, rk, sw, cmp = struct.unpack(">QIQQ", rest[:28]); info += f" AtomicETH va={va:#x} rkey={rk:#x} swap/add={sw:#x} cmp={cmp:#x}"; rest = rest[28:]
            if low in (13,15,16,17,18):
                a = struct.unpack(">I", rest[:4])[0]; info += f" AETH {aeth_str(a)}"; rest = rest[4:]
            if low == 18: info += f" AtomicAckETH orig={struct.unpack('>Q',rest[:8])[0]:#x}"; rest = rest[8:]
            if low in (3,5,9,11): info += f" ImmDt={bytes(rest[:4]).hex()}"; rest = rest[4:]
            if low in (22,23): info += f" IETH rkey={bytes(rest[:4]).hex()}"; rest = rest[4:]
            lines.append(f"  {n:3d} {fam} {src[-8:]}>{dst[-8:]} sp={sport:#06x} {opname(op):24s} se={se} m={mig} pad={pad} dqp={dqp:#x} A={ack} psn={psn:#08x} pay={len(rest)-pad}{info} {'OK' if good else 'BADICRC'}")
        print(f"{path}: {n} RoCEv2 packets, ICRC ok {ok}, bad {n-ok}")
        for k, v in sorted(ops.items(), key=lambda x: x[0][-5:]): print(f"   {v:4d}  {k}")
        for k, v in sorted(extra.items()): print(f"   [{k}] x{v}")
        if verbose: print("\n".join(lines))
        bad_total += n - ok
    sys.exit(1 if bad_total else 0)
main()
