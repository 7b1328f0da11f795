package stack

// CallsInside is how many calls are using c's descriptors now.
func CallsInside(c *UDPConn) int64 { return c.use.Load() &^ useClosing }
