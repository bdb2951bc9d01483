#!/usr/bin/env bash
# The instruction-set guard: disassembles kvx's libraries and fails when a
# function contains an instruction from an extension that its dispatch does
# not check. Machine-independent: it reads the objects, it runs none of them,
# so a build on any x86 CPU catches a kernel that would raise SIGILL on
# another (the case that motivated it: Highway 1.0.3's AVX3_DL target emitted
# AVX-VNNI's "{vex} vpdpbusd", which AVX-512 CPUs without AVX-VNNI lack).
#
# Usage: tests/isa_guard.sh ARCHIVE_OR_OBJECT...
#
# Each function is classed by its (demangled) name; the class is the set of
# extensions its dispatch checks before calling it:
#   N_AVX3_DL::          ops/ AVX-512 target (ops/simd_target.cc verifies
#                        AVX-512 F/VL/DQ/BW/VNNI/VBMI/VBMI2/BITALG/VPOPCNTDQ,
#                        VAES, VPCLMULQDQ): no AVX-VNNI, CD, IFMA, BF16, FP16
#   N_AVX2::...Vnni...   AVX2 + AVX-VNNI (simd_target.cc's AVX2_VNNI flag)
#   N_AVX2::             AVX2/FMA/F16C/BMI2: no AVX-512, no VNNI of any kind
#   *Avx512Vnni*         AVX-512 F + AVX512-VNNI (e.g. roofline's probe)
#   *AvxVnni*            AVX2 + AVX-VNNI
#   kv::simd::avx512::,  AVX-512 F/BW/VL/DQ only (kv/codec/simd_avx512.h,
#   *Avx512*             roofline.cc)
#   kv::simd::, *Avx2*   AVX2/FMA/F16C: no AVX-512, no VNNI
#   everything else      baseline x86-64: no VEX or EVEX instruction at all
# So a kernel compiled with its own target attribute lives in one of these
# namespaces or carries its ISA in its name, and its caller checks exactly
# that; otherwise the guard names it.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: $0 ARCHIVE_OR_OBJECT..." >&2
  exit 2
fi
if ! command -v objdump >/dev/null; then
  echo "isa_guard: objdump (binutils) not found" >&2
  exit 2
fi

objdump -d --no-show-raw-insn -C -w "$@" | awk '
function classify(fn,    name) {
  name = fn
  gsub(/\(anonymous namespace\)/, "anon", name)
  if (index(name, "(") > 0) name = substr(name, 1, index(name, "(") - 1)
  if (name ~ /N_AVX3_DL::/) return "avx3_dl"
  if (name ~ /N_AVX2::/ && name ~ /Vnni/) return "avx2_vnni"
  if (name ~ /N_AVX2::/) return "avx2"
  if (name ~ /N_(SCALAR|EMU128|SSE2|SSSE3|SSE4)::/) return "baseline"
  if (name ~ /Avx512Vnni/) return "avx512_vnni"
  if (name ~ /AvxVnni/) return "avx2_vnni"
  if (name ~ /kvx::kv::simd::avx512::/ || name ~ /Avx512/) return "avx512"
  if (name ~ /kvx::kv::simd::/ || name ~ /Avx2/) return "avx2"
  return "baseline"
}
# What an instruction needs beyond its class, or "" when the class covers it.
function violation(cls, pseudo, mn, ops,    avx512, vnni) {
  if (cls == "baseline") {
    if (pseudo != "" || mn ~ /^v/ && mn !~ /^ver[rw]$/) return "a VEX/EVEX (AVX) instruction in baseline code"
    return ""
  }
  avx512 = (ops ~ /%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])([^0-9]|$)|\{1to[0-9]+\}/ || pseudo == "{evex}" ||
            mn ~ /^(vpternlog|vperm[it]2|vpcompress|vpexpand|vcompressp|vexpandp|vpmov[bwdq]2m|vpmovm2|vpro[lr]|vpsraq|vpsravw|vpsravq|vpsllvw|vpsrlvw|vrcp14|vrsqrt14|vscalef|vgetexp|vgetmant|vfixupimm|vrndscale|vreduce|vrange|vpconflict|vplzcnt|vdbpsadbw|vpmultishiftqb|vpopcnt|vpshld|vpshrd|vpshufbitqmb|valign|vblendm|vpblendm|vptestm|vptestnm|vpabsq|vpmullq|vfpclass|vpermw|vpermb|vpmadd52|k[a-z]+)/ ||
            mn ~ /^v(pmaxsq|pmaxuq|pminsq|pminuq)$/ || mn ~ /^v(extract|insert)[fi](32x4|32x8|64x2|64x4)$/ ||
            mn ~ /^vbroadcast[fi](32x2|32x4|32x8|64x2|64x4)$/ || mn ~ /^vshuf[fi](32x4|64x2)$/ ||
            mn ~ /^vpmov(s|us)?(db|dw|qb|qw|qd|wb)$/ || mn ~ /^vcvt(t)?(ps|pd|ss|sd)2u|^vcvtu|^vcvt(t)?(ps|pd)2qq|^vcvtqq2/)
  vnni = (mn ~ /^vpdp(bu|bs|bu|ws|wu|ws)[sd]?[sd]?s?$/ || mn ~ /^vpdp/)
  if (mn ~ /bf16/ || mn ~ /^vdpbf16/) return "AVX512-BF16"
  if (mn ~ /^(tile|ldtilecfg|sttilecfg|tdp)/) return "AMX"
  if (mn ~ /^v(add|sub|mul|div|max|min|sqrt|rcp|rsqrt|scalef|getexp|getmant|reduce|rndscale|fmadd[0-9]*|fmsub[0-9]*|fnmadd[0-9]*|fnmsub[0-9]*|fmaddsub[0-9]*|fmsubadd[0-9]*|cmp[a-z]*)(ph|sh)$/) return "AVX512-FP16"
  if (mn ~ /^(vpconflict|vplzcnt)/) return "AVX512-CD"
  if (mn ~ /^vpmadd52/) return "AVX512-IFMA"
  if (vnni && pseudo == "{vex}") {
    if (cls == "avx2_vnni") return ""
    return "AVX-VNNI (the VEX vpdp* form)"
  }
  if (vnni) {
    if (cls == "avx3_dl" || cls == "avx512_vnni") return ""
    return "AVX512-VNNI (the EVEX vpdp* form)"
  }
  if (cls == "avx3_dl" || cls == "avx512_vnni") return ""
  if (cls == "avx512") {
    if (mn ~ /^(vpermb|vpermt2b|vpermi2b|vpmultishiftqb)$/) return "AVX512-VBMI"
    if (mn ~ /^(vpcompress[bw]|vpexpand[bw]|vpshld|vpshrd)/) return "AVX512-VBMI2"
    if (mn ~ /^(vpopcnt[bw]|vpshufbitqmb)$/) return "AVX512-BITALG"
    if (mn ~ /^vpopcnt[dq]$/) return "AVX512-VPOPCNTDQ"
    if (mn ~ /^vgf2p8/) return "GFNI"
    return ""
  }
  # avx2 and avx2_vnni: nothing of AVX-512, no wide AES/CLMUL/GFNI.
  if (avx512) return "AVX-512"
  if (mn ~ /^vgf2p8/) return "GFNI"
  if ((mn ~ /^vaes/ || mn ~ /^vpclmul/) && ops ~ /%ymm/) return "VAES/VPCLMULQDQ"
  return ""
}
/^[0-9a-f]+ <.*>:$/ {
  fn = substr($0, index($0, "<") + 1)
  fn = substr(fn, 1, length(fn) - 2)
  cls = classify(fn)
  classes[cls]++
  next
}
/^ +[0-9a-f]+:\t/ {
  insn = substr($0, index($0, "\t") + 1)
  n = split(insn, w, /[ \t]+/)
  i = 1
  pseudo = ""
  while (i <= n && (w[i] ~ /^\{(vex|vex3|evex)\}$/ || w[i] ~ /^(lock|rep|repz|repnz|repe|repne|notrack|bnd|data16|addr32|cs|ds|es|ss|fs|gs)$/)) {
    if (w[i] ~ /^\{/) pseudo = w[i]
    i++
  }
  mn = w[i]
  ops = substr(insn, index(insn, mn) + length(mn))
  ninsn++
  why = violation(cls, pseudo, mn, ops)
  if (why != "") {
    bad++
    if (!(fn in seen)) {
      seen[fn] = 1
      nfn++
      if (nfn <= 25) printf("isa_guard: %s\n    in %s (class %s): needs %s, which its dispatch does not check\n", insn, fn, cls, why)
    }
  }
}
END {
  if (ninsn == 0) { print "isa_guard: no instructions read (objdump output not understood)"; exit 1 }
  printf("isa_guard: %d instructions, functions by class:", ninsn)
  for (c in classes) printf(" %s=%d", c, classes[c])
  printf("\n")
  if (bad > 0) { printf("isa_guard: FAILED: %d instructions in %d functions\n", bad, nfn); exit 1 }
  print "isa_guard: every instruction is covered by its function'"'"'s dispatch check"
}'
