package stats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
)

// The payload is the Snapshot walked field by field in declaration order:
// integers as 8 bytes little-endian, bools as one byte, strings and slices
// as a 4-byte length and their elements. Nothing names the fields: the
// header carries a hash of the layout (field names, json names and kinds),
// and a reader whose layout differs refuses the file instead of
// misreading it.

// ErrFormat: the file is not a stats file, or was written by a vmaxdp of
// another format version or layout.
var ErrFormat = errors.New("not a vmaxdp stats file of this version")

// ErrCorrupt: the payload does not decode.
var ErrCorrupt = errors.New("corrupt stats payload")

// maxElems bounds a decoded slice or string, so that a corrupt length
// cannot make a reader allocate without bound.
const maxElems = 1 << 24

// layoutHash names Snapshot's layout in the file's header, so that a
// reader of another build refuses a file it would misread (ErrFormat).
// TestLayoutHash computes it from the type with reflection, and fails on a
// change of Snapshot until this is updated (with FormatVersion when old
// files no longer decode). A constant: computed as a package variable, it
// was the dearest init of the preload library, which every preloaded
// process pays as it starts, a program that makes no socket too (0.1 ms
// and 559 allocations, GODEBUG=inittrace=1).
const layoutHash uint64 = 0x24f7189da43c1ddf

// appendValue appends v's encoding to b. It allocates nothing beyond
// growing b.
func appendValue(b []byte, v reflect.Value) []byte {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			b = appendValue(b, v.Field(i))
		}
	case reflect.Slice:
		b = binary.LittleEndian.AppendUint32(b, uint32(v.Len()))
		for i := range v.Len() {
			b = appendValue(b, v.Index(i))
		}
	case reflect.String:
		s := v.String()
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	case reflect.Bool:
		if v.Bool() {
			return append(b, 1)
		}
		return append(b, 0)
	case reflect.Int, reflect.Int32, reflect.Int64:
		b = binary.LittleEndian.AppendUint64(b, uint64(v.Int()))
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		b = binary.LittleEndian.AppendUint64(b, v.Uint())
	default:
		panic(fmt.Sprintf("stats: field kind %s has no encoding", v.Kind()))
	}
	return b
}

type decoder struct {
	b   []byte
	off int
}

func (d *decoder) take(n int) ([]byte, error) {
	if n < 0 || len(d.b)-d.off < n {
		return nil, fmt.Errorf("%w: %d bytes needed at offset %d of %d", ErrCorrupt, n, d.off, len(d.b))
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p, nil
}

func (d *decoder) length() (int, error) {
	p, err := d.take(4)
	if err != nil {
		return 0, err
	}
	n := binary.LittleEndian.Uint32(p)
	// Every element takes at least one byte: a length beyond what is
	// left is corrupt, whatever the element type.
	if n > maxElems || int(n) > len(d.b)-d.off {
		return 0, fmt.Errorf("%w: length %d at offset %d exceeds the %d bytes left", ErrCorrupt, n, d.off-4, len(d.b)-d.off)
	}
	return int(n), nil
}

func (d *decoder) value(v reflect.Value) error {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if err := d.value(v.Field(i)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		n, err := d.length()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil // nil, as encoded: json's omitempty sees the same
		}
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			if err := d.value(v.Index(i)); err != nil {
				return err
			}
		}
	case reflect.String:
		n, err := d.length()
		if err != nil {
			return err
		}
		p, err := d.take(n)
		if err != nil {
			return err
		}
		v.SetString(string(p))
	case reflect.Bool:
		p, err := d.take(1)
		if err != nil {
			return err
		}
		if p[0] > 1 {
			return fmt.Errorf("%w: bool %d at offset %d", ErrCorrupt, p[0], d.off-1)
		}
		v.SetBool(p[0] == 1)
	case reflect.Int, reflect.Int32, reflect.Int64:
		p, err := d.take(8)
		if err != nil {
			return err
		}
		x := int64(binary.LittleEndian.Uint64(p))
		if v.OverflowInt(x) {
			return fmt.Errorf("%w: %d overflows %s at offset %d", ErrCorrupt, x, v.Type(), d.off-8)
		}
		v.SetInt(x)
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		p, err := d.take(8)
		if err != nil {
			return err
		}
		x := binary.LittleEndian.Uint64(p)
		if v.OverflowUint(x) {
			return fmt.Errorf("%w: %d overflows %s at offset %d", ErrCorrupt, x, v.Type(), d.off-8)
		}
		v.SetUint(x)
	default:
		return fmt.Errorf("stats: field kind %s has no encoding", v.Kind())
	}
	return nil
}

// Encode appends s's payload encoding to b.
func Encode(b []byte, s *Snapshot) []byte {
	return appendValue(b, reflect.ValueOf(s).Elem())
}

// Decode reads a payload made by Encode. A payload that is short, long or
// malformed is an error wrapping ErrCorrupt.
func Decode(b []byte, s *Snapshot) error {
	*s = Snapshot{}
	d := decoder{b: b}
	if err := d.value(reflect.ValueOf(s).Elem()); err != nil {
		return err
	}
	if d.off != len(b) {
		return fmt.Errorf("%w: %d bytes left over after the snapshot", ErrCorrupt, len(b)-d.off)
	}
	return nil
}
