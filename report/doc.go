// Package report explains a nettrace recording after the fact: where
// packets went, which were dropped, where and why, how NAPI and softirqs
// spent their budget, how long each stage of the receive and transmit
// paths took, and how all of that lines up, interval by interval, with the
// NIC's, the kernel's, the AF_XDP sockets' and vmaxdp's counters. A rule
// base turns what it found into findings, each with its evidence and a fix.
//
// Build streams a trace file once. Its memory is bounded whatever the
// recording's length: tables cap their distinct keys (MaxKeys, the rest is
// counted as "other"), time series halve their resolution instead of
// growing, and packets followed through the stages are forgotten after
// MaxInFlight (and counted as untracked). A Report then renders as text,
// JSON (schema SchemaVersion) or one self-contained HTML page.
//
// It must not reach the running kernel: everything comes from the file.
package report
