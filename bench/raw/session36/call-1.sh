#!/usr/bin/env bash
# Session 36, call 1: session 35's call-4.sh as it ran (LIMIT=540): v25 against v24 — kernel
# tests with v25, `bench op` at the four anchors, Nsight Compute of the forward (out of time).
LIMIT=${LIMIT:-540} exec bash "$(dirname "$0")/../session35/call-4.sh"
