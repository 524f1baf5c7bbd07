//go:build amd64 && !purego

#include "textflag.h"

// Folding constants for the bit-reflected CRC-32 (IEEE 802.3) polynomial, each pair being
// x^(D+32) mod P and x^(D-32) mod P, bit-reflected and shifted left by one, for a fold across D bits.
// Every 128-bit lane of a 512-bit register takes the same pair, so those tables hold it four times.
// D = 2048: four registers, 256 bytes apart. D = 512: one register onto the next (hash/crc32's r2r1).
// D = 128: one lane onto the next.
DATA k2048<>+0(SB)/8, $0x11542778a
DATA k2048<>+8(SB)/8, $0x1322d1430
DATA k2048<>+16(SB)/8, $0x11542778a
DATA k2048<>+24(SB)/8, $0x1322d1430
DATA k2048<>+32(SB)/8, $0x11542778a
DATA k2048<>+40(SB)/8, $0x1322d1430
DATA k2048<>+48(SB)/8, $0x11542778a
DATA k2048<>+56(SB)/8, $0x1322d1430
GLOBL k2048<>(SB), RODATA, $64

DATA k512<>+0(SB)/8, $0x154442bd4
DATA k512<>+8(SB)/8, $0x1c6e41596
DATA k512<>+16(SB)/8, $0x154442bd4
DATA k512<>+24(SB)/8, $0x1c6e41596
DATA k512<>+32(SB)/8, $0x154442bd4
DATA k512<>+40(SB)/8, $0x1c6e41596
DATA k512<>+48(SB)/8, $0x154442bd4
DATA k512<>+56(SB)/8, $0x1c6e41596
GLOBL k512<>(SB), RODATA, $64

DATA k128<>+0(SB)/8, $0x1751997d0
DATA k128<>+8(SB)/8, $0x0ccaa009e
GLOBL k128<>(SB), RODATA, $16

// FOLD sets A to A carried across the distance the constants K are for, plus B: the carry-less
// products of A's low and high quadwords (in each 128-bit lane) with K's, XORed with B. T is scratch.
#define FOLD(K, A, T, B) \
	VPCLMULQDQ $0x11, K, A, T \
	VPCLMULQDQ $0x00, K, A, A \
	VPTERNLOGD $0x96, B, T, A

// func fold4(state uint32, p []byte, rest *[16]byte)
TEXT ·fold4(SB), NOSPLIT, $0-40
	MOVL state+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ rest+32(FP), DI

	// The first 256 bytes, the state merged into the first four.
	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPXORQ    Z10, Z10, Z10
	VMOVD     AX, X10
	VPXORQ    Z10, Z1, Z1
	ADDQ      $256, SI
	SUBQ      $256, CX
	VMOVDQU64 k2048<>+0(SB), Z0
	CMPQ      CX, $256
	JL        reduce

	PCALIGN $16
loop:
	// Each register, multiplied across 2048 bits, plus the next 64 bytes of its lane.
	VMOVDQU64  (SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	FOLD(Z0, Z1, Z5, Z11)
	FOLD(Z0, Z2, Z6, Z12)
	FOLD(Z0, Z3, Z7, Z13)
	FOLD(Z0, Z4, Z8, Z14)
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JGE        loop

reduce:
	// Fold the registers into the last, each across 512 bits onto the next.
	VMOVDQU64 k512<>+0(SB), Z0
	FOLD(Z0, Z1, Z5, Z2)
	FOLD(Z0, Z1, Z5, Z3)
	FOLD(Z0, Z1, Z5, Z4)

	// Then its four 128-bit lanes, each across 128 bits onto the next.
	VEXTRACTI32X4 $1, Z1, X2
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $3, Z1, X4
	VMOVDQU       k128<>+0(SB), X0
	FOLD(X0, X1, X5, X2)
	FOLD(X0, X1, X5, X3)
	FOLD(X0, X1, X5, X4)
	VMOVDQU       X1, (DI)
	VZEROUPPER
	RET
