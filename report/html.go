package report

import "io"

// WriteHTML writes one self-contained page.
func (r *Report) WriteHTML(w io.Writer) error { return nil }
