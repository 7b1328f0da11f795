package bpf

// ArrivalMetaLen and ArrivalMagic mirror steer.c's struct arrival_meta,
// the XDP metadata just before each frame the steering program redirects
// while arrival_stamps is on: the CLOCK_MONOTONIC nanoseconds of the
// redirect at offset 0 and ArrivalMagic at offset 8, in host byte order.
const (
	ArrivalMetaLen = 16
	ArrivalMagic   = 0x766d7873
)
