//go:build !cgo

package verbs

import "fmt"

// Devices: a build without cgo cannot load libibverbs.
func Devices() ([]string, error) {
	return nil, fmt.Errorf("%w: vmaxdp was built without cgo", ErrNoLibrary)
}
