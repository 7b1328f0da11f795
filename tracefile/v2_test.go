package tracefile

// appendCompact appends e's version 2 encoding to b, leaving out the comm and
// dev that last holds, and updates last.
func appendCompact(b []byte, e *Event, last *lastTask) []byte {
	var present uint16
	b = le.AppendUint16(b, e.Probe)
	at := len(b)
	b = le.AppendUint16(b, 0) // present, known at the end
	b = le.AppendUint64(b, e.Time)
	b = le.AppendUint32(b, e.CPU)
	b = le.AppendUint32(b, e.PID)
	b = le.AppendUint32(b, e.TID)
	for i, v := range [...]uint64{e.Skb, e.Location, e.Sk} {
		if v != 0 {
			present |= evSkb << i
			b = le.AppendUint64(b, v)
		}
	}
	for i, v := range [...]uint32{e.Netns, e.Ifindex, e.Len, e.Reason} {
		if v != 0 {
			present |= evNetns << i
			b = le.AppendUint32(b, v)
		}
	}
	for i, v := range [...]uint16{e.Protocol, e.Flags} {
		if v != 0 {
			present |= evProtocol << i
			b = le.AppendUint16(b, v)
		}
	}
	for i, v := range e.Arg {
		if v != 0 {
			present |= evArg0 << i
			b = le.AppendUint32(b, uint32(v))
		}
	}
	if e.Comm != last.comm {
		present |= evComm
		b = append(b, e.Comm[:]...)
		last.comm = e.Comm
	}
	if e.Dev != last.dev {
		present |= evDev
		b = append(b, e.Dev[:]...)
		last.dev = e.Dev
	}
	if n := min(len(e.Data), MaxCapLen); n > 0 {
		present |= evData
		b = le.AppendUint16(b, uint16(n))
		b = append(b, e.Data[:n]...)
	}
	le.PutUint16(b[at:], present)
	return b
}
