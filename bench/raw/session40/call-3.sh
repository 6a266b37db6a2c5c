#!/usr/bin/env bash
# Session 40, call 3 (the machine of call 2, still warm): T = 8192 for v36 and v35, which call 2's
# 115 s per process did not reach. As run (one command line).
export CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64; SECONDS=0; for v in v36 v35; do xz -dc bin-gpu/loglinear-$v.xz > /tmp/ll-$v && chmod +x /tmp/ll-$v; done; for v in v36 v35; do echo "== $v T=8192 ($SECONDS s)" >> $OUT/op.txt; timeout 120 /tmp/ll-$v bench op --device cuda --dtype bf16 --runs 3 --forms fused --t 8192 >> $OUT/op.txt 2>&1; echo "$v rc=$? ($SECONDS s)"; done; grep -E "^==|^\| fused|correctness" $OUT/op.txt
