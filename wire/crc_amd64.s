//go:build amd64 && !purego

#include "textflag.h"

// Folding constants for the bit-reflected CRC-32 (IEEE 802.3) polynomial, each pair being
// x^(D+32) mod P and x^(D-32) mod P, bit-reflected and shifted left by one, for a fold across D bits.
// Every 128-bit lane of a 512-bit register takes the same pair, so those tables hold it four times.
// D = 2048: four registers, 256 bytes apart. D = 512: one register onto the next (hash/crc32's r2r1).
// D = 128: one lane onto the next, or a 16-byte block onto the next.
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

// The same for foldCRC's 256-bit registers, the pair twice. D = 1024: four registers, 128 bytes
// apart. D = 256: one register onto the next. (TestFoldConstants computes every pair here.)
DATA k1024<>+0(SB)/8, $0x1e88ef372
DATA k1024<>+8(SB)/8, $0x14a7fe880
DATA k1024<>+16(SB)/8, $0x1e88ef372
DATA k1024<>+24(SB)/8, $0x14a7fe880
GLOBL k1024<>(SB), RODATA, $32

DATA k256<>+0(SB)/8, $0x0f1da05aa
DATA k256<>+8(SB)/8, $0x15a546366
DATA k256<>+16(SB)/8, $0x0f1da05aa
DATA k256<>+24(SB)/8, $0x15a546366
GLOBL k256<>(SB), RODATA, $32

// FOLD sets A to A carried across the distance the constants K are for, plus B: the carry-less
// products of A's low and high quadwords (in each 128-bit lane) with K's, XORed with B. T is scratch.
#define FOLD(K, A, T, B) \
	VPCLMULQDQ $0x11, K, A, T \
	VPCLMULQDQ $0x00, K, A, A \
	VPTERNLOGD $0x96, B, T, A

// FOLDX is FOLD without AVX-512: two XORs for the three-way one. The 128-bit steps that both bodies
// share use it.
#define FOLDX(K, A, T, B) \
	VPCLMULQDQ $0x11, K, A, T \
	VPCLMULQDQ $0x00, K, A, A \
	VPXOR      B, T, T \
	VPXOR      T, A, A

// The constants of the final reduction, for the bit-reflected polynomial as above: x^64 mod P
// (128 bits to 64), and Barrett's P and floor(x^64 / P). Intel's paper, section 4.
DATA k64<>+0(SB)/8, $0x163cd6124
GLOBL k64<>(SB), RODATA, $8

DATA barrett<>+0(SB)/8, $0x1db710641
DATA barrett<>+8(SB)/8, $0x1f7011641
GLOBL barrett<>(SB), RODATA, $16

// func foldCRC(head []byte, p []byte) uint32
//
// The head and the tail go one 16-byte block at a time. p's bulk, when it is long enough, takes four
// registers at once: 512-bit ones 256 bytes apart where wide is set (AVX-512), else 256-bit ones 128
// bytes apart (AVX2 and the VEX-encoded VPCLMULQDQ, as on AMD's Zen 3).
TEXT ·foldCRC(SB), NOSPLIT, $0-52
	MOVQ head_base+0(FP), SI
	MOVQ head_len+8(FP), CX
	MOVQ p_base+24(FP), DI
	MOVQ p_len+32(FP), DX
	VMOVDQU k128<>+0(SB), X0

	// The head, one 16-byte block onto the next, into X1.
	VMOVDQU (SI), X1
	ADDQ    $16, SI
	SUBQ    $16, CX

head:
	CMPQ    CX, $16
	JL      body
	VMOVDQU (SI), X2
	FOLDX(X0, X1, X5, X2)
	ADDQ    $16, SI
	SUBQ    $16, CX
	JMP     head

body:
	// Either body starts its first register with X1 carried across 128 bits, onto the first 16
	// bytes of p; VEX encoding clears the upper lanes of Z6.
	CMPB ·wide(SB), $0
	JEQ  body256
	CMPQ DX, $512
	JL   tail

	// Four 512-bit registers over p's 256-byte blocks.
	VPCLMULQDQ $0x11, X0, X1, X5
	VPCLMULQDQ $0x00, X0, X1, X6
	VPXOR      X5, X6, X6
	VMOVDQU64  (DI), Z1
	VMOVDQU64  64(DI), Z2
	VMOVDQU64  128(DI), Z3
	VMOVDQU64  192(DI), Z4
	VPXORQ     Z6, Z1, Z1
	ADDQ       $256, DI
	SUBQ       $256, DX
	VMOVDQU64  k2048<>+0(SB), Z0

	PCALIGN $16
lanes512:
	// Each register, multiplied across 2048 bits, plus the next 64 bytes of its lane.
	VMOVDQU64 (DI), Z11
	VMOVDQU64 64(DI), Z12
	VMOVDQU64 128(DI), Z13
	VMOVDQU64 192(DI), Z14
	FOLD(Z0, Z1, Z5, Z11)
	FOLD(Z0, Z2, Z6, Z12)
	FOLD(Z0, Z3, Z7, Z13)
	FOLD(Z0, Z4, Z8, Z14)
	ADDQ      $256, DI
	SUBQ      $256, DX
	CMPQ      DX, $256
	JGE       lanes512

	// Fold the registers into the first, each across 512 bits onto the next; then its four 128-bit
	// lanes, each across 128 bits onto the next.
	VMOVDQU64     k512<>+0(SB), Z0
	FOLD(Z0, Z1, Z5, Z2)
	FOLD(Z0, Z1, Z5, Z3)
	FOLD(Z0, Z1, Z5, Z4)
	VEXTRACTI32X4 $1, Z1, X2
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $3, Z1, X4
	VMOVDQU       k128<>+0(SB), X0
	FOLD(X0, X1, X5, X2)
	FOLD(X0, X1, X5, X3)
	FOLD(X0, X1, X5, X4)
	JMP           tail

body256:
	CMPQ DX, $256
	JL   tail

	// Four 256-bit registers over p's 128-byte blocks.
	VPCLMULQDQ $0x11, X0, X1, X5
	VPCLMULQDQ $0x00, X0, X1, X6
	VPXOR      X5, X6, X6
	VMOVDQU    (DI), Y1
	VMOVDQU    32(DI), Y2
	VMOVDQU    64(DI), Y3
	VMOVDQU    96(DI), Y4
	VPXOR      Y6, Y1, Y1
	ADDQ       $128, DI
	SUBQ       $128, DX
	VMOVDQU    k1024<>+0(SB), Y0

	PCALIGN $16
lanes256:
	// Each register, multiplied across 1024 bits, plus the next 32 bytes of its lane.
	VMOVDQU (DI), Y11
	VMOVDQU 32(DI), Y12
	VMOVDQU 64(DI), Y13
	VMOVDQU 96(DI), Y14
	FOLDX(Y0, Y1, Y5, Y11)
	FOLDX(Y0, Y2, Y6, Y12)
	FOLDX(Y0, Y3, Y7, Y13)
	FOLDX(Y0, Y4, Y8, Y14)
	ADDQ    $128, DI
	SUBQ    $128, DX
	CMPQ    DX, $128
	JGE     lanes256

	// Fold the registers into the first, each across 256 bits onto the next; then its two 128-bit
	// lanes, across 128 bits.
	VMOVDQU      k256<>+0(SB), Y0
	FOLDX(Y0, Y1, Y5, Y2)
	FOLDX(Y0, Y1, Y5, Y3)
	FOLDX(Y0, Y1, Y5, Y4)
	VEXTRACTI128 $1, Y1, X2
	VMOVDQU      k128<>+0(SB), X0
	FOLDX(X0, X1, X5, X2)

tail:
	// What is left of p, 16 bytes at a time.
	CMPQ    DX, $16
	JL      reduce
	VMOVDQU (DI), X2
	FOLDX(X0, X1, X5, X2)
	ADDQ    $16, DI
	SUBQ    $16, DX
	JMP     tail

reduce:
	// 128 bits to 96: the low quadword across 64 bits onto the high one.
	VPCLMULQDQ $0x10, X0, X1, X2
	VPSRLDQ    $8, X1, X1
	VPXOR      X2, X1, X1

	// 96 bits to 64: the low doubleword across 64 bits onto the rest. X3 keeps the low doubleword
	// of each quadword.
	VPCMPEQB   X3, X3, X3
	VPSRLQ     $32, X3, X3
	VMOVQ      k64<>+0(SB), X0
	VPSRLDQ    $4, X1, X2
	VPAND      X3, X1, X1
	VPCLMULQDQ $0x00, X0, X1, X1
	VPXOR      X2, X1, X1

	// Barrett: the remainder of the 64 bits modulo P lands in the second doubleword.
	VMOVDQU    barrett<>+0(SB), X0
	VPAND      X3, X1, X2
	VPCLMULQDQ $0x10, X0, X2, X2
	VPAND      X3, X2, X2
	VPCLMULQDQ $0x00, X0, X2, X2
	VPXOR      X1, X2, X2
	VPEXTRD    $1, X2, AX
	MOVL       AX, ret+48(FP)
	VZEROUPPER
	RET

// func cpuid7ECX() uint32
//
// CPUID leaf 7 (subleaf 0)'s ECX: the caller knows the CPU has the leaf.
TEXT ·cpuid7ECX(SB), NOSPLIT, $0-4
	MOVL  $7, AX
	MOVL  $0, CX
	CPUID
	MOVL  CX, ret+0(FP)
	RET
