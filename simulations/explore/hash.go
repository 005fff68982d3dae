package explore

import (
	"encoding/binary"
	"hash/maphash"
	"reflect"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// A digest identifies a state: two states with equal digests are explored
// once. It is a 128-bit hash (two hash/maphash sums under the process's
// seeds) of the whole world, read down to the unexported fields of the
// real cores, so nothing of their state can be left out by a hand-written
// summary that drifts from the code.
type digest [16]byte

var seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func sum(b []byte) digest {
	var d digest
	binary.LittleEndian.PutUint64(d[:8], maphash.Bytes(seeds[0], b))
	binary.LittleEndian.PutUint64(d[8:], maphash.Bytes(seeds[1], b))
	return d
}

// digestOf returns the digest of the value graph that v points to.
func digestOf(v any) digest {
	var h hasher
	return h.digest(v)
}

// digest is digestOf with h's buffer, kept for the next call.
func (h *hasher) digest(v any) digest {
	h.buf, h.path = h.buf[:0], h.path[:0]
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer {
		p := reflect.New(rv.Type())
		p.Elem().Set(rv)
		rv = p
	}
	h.pointer(planOf(rv.Type().Elem()), rv.UnsafePointer())
	return sum(h.buf)
}

// hasher writes a canonical encoding of a value graph: maps in the order of
// their entries' own digests (so iteration order never matters), pointers
// followed (a cycle is cut at the pointer that closes it, which depends
// only on the path, not on what was visited before), funcs and channels by
// nil-ness only, time.Time by its instant. It reads memory by the layout
// reflect gives for each type (a plan, built once per type), which is
// what makes a digest cheap enough to take of every state.
type hasher struct {
	buf  []byte
	path []unsafe.Pointer
}

// plan is how to encode one type.
type plan struct {
	t      reflect.Type
	kind   reflect.Kind
	size   uintptr
	fields []field // struct
	elem   *plan   // pointer, slice, array; map value
	key    *plan   // map key
	isTime bool
}

type field struct {
	off uintptr
	p   *plan
}

var plans sync.Map // reflect.Type -> *plan

var timeType = reflect.TypeFor[time.Time]()

func planOf(t reflect.Type) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	var mu sync.Mutex // plans of recursive types are built once under it
	mu.Lock()
	defer mu.Unlock()
	return build(t, map[reflect.Type]*plan{})
}

func build(t reflect.Type, doing map[reflect.Type]*plan) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	if p, ok := doing[t]; ok {
		return p
	}
	p := &plan{t: t, kind: t.Kind(), size: t.Size(), isTime: t == timeType}
	doing[t] = p
	switch {
	case p.isTime:
	case p.kind == reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			p.fields = append(p.fields, field{off: f.Offset, p: build(f.Type, doing)})
		}
	case p.kind == reflect.Pointer, p.kind == reflect.Slice, p.kind == reflect.Array:
		p.elem = build(t.Elem(), doing)
	case p.kind == reflect.Map:
		p.key, p.elem = build(t.Key(), doing), build(t.Elem(), doing)
	}
	plans.Store(t, p)
	return p
}

func (h *hasher) u64(x uint64) { h.buf = binary.LittleEndian.AppendUint64(h.buf, x) }

func (h *hasher) str(s string) {
	h.u64(uint64(len(s)))
	h.buf = append(h.buf, s...)
}

// pointer encodes what ptr (a *p.t) points to.
func (h *hasher) pointer(p *plan, ptr unsafe.Pointer) {
	if p.isTime {
		h.u64(uint64((*time.Time)(ptr).UnixNano()))
		return
	}
	switch p.kind {
	case reflect.Bool:
		if *(*bool)(ptr) {
			h.buf = append(h.buf, 1)
		} else {
			h.buf = append(h.buf, 2)
		}
	case reflect.Int8, reflect.Uint8:
		h.buf = append(h.buf, *(*uint8)(ptr))
	case reflect.Int16, reflect.Uint16:
		h.buf = binary.LittleEndian.AppendUint16(h.buf, *(*uint16)(ptr))
	case reflect.Int32, reflect.Uint32, reflect.Float32:
		h.buf = binary.LittleEndian.AppendUint32(h.buf, *(*uint32)(ptr))
	case reflect.Int, reflect.Uint, reflect.Int64, reflect.Uint64, reflect.Uintptr, reflect.Float64:
		h.u64(*(*uint64)(ptr))
	case reflect.String:
		h.str(*(*string)(ptr))
	case reflect.Struct:
		for _, f := range p.fields {
			h.pointer(f.p, unsafe.Add(ptr, f.off))
		}
	case reflect.Array:
		n := p.t.Len()
		for i := range n {
			h.pointer(p.elem, unsafe.Add(ptr, uintptr(i)*p.elem.size))
		}
	case reflect.Slice:
		s := (*sliceHeader)(ptr)
		if s.data == nil {
			h.buf = append(h.buf, 3)
			return
		}
		h.u64(uint64(s.len))
		for i := range s.len {
			h.pointer(p.elem, unsafe.Add(s.data, uintptr(i)*p.elem.size))
		}
	case reflect.Pointer:
		q := *(*unsafe.Pointer)(ptr)
		if q == nil {
			h.buf = append(h.buf, 4)
			return
		}
		if slices.Contains(h.path, q) {
			h.buf = append(h.buf, 5) // a cycle: cut here
			return
		}
		h.path = append(h.path, q)
		h.pointer(p.elem, q)
		h.path = h.path[:len(h.path)-1]
	case reflect.Interface:
		v := reflect.NewAt(p.t, ptr).Elem()
		if v.IsNil() {
			h.buf = append(h.buf, 6)
			return
		}
		e := v.Elem()
		h.str(e.Type().String())
		c := reflect.New(e.Type()) // a copy: the dynamic value is not addressable
		c.Elem().Set(e)
		h.pointer(planOf(e.Type()), c.UnsafePointer())
	case reflect.Map:
		m := reflect.NewAt(p.t, ptr).Elem()
		if m.IsNil() {
			h.buf = append(h.buf, 7)
			return
		}
		entries := make([]digest, 0, m.Len())
		k := reflect.New(p.t.Key()).Elem()
		v := reflect.New(p.t.Elem()).Elem()
		it := m.MapRange()
		mark := len(h.buf) // each entry is encoded after the buffer, summed, and cut off
		for it.Next() {
			k.SetIterKey(it)
			v.SetIterValue(it)
			h.pointer(p.key, k.Addr().UnsafePointer())
			h.pointer(p.elem, v.Addr().UnsafePointer())
			entries = append(entries, sum(h.buf[mark:]))
			h.buf = h.buf[:mark]
		}
		slices.SortFunc(entries, func(a, b digest) int { return slices.Compare(a[:], b[:]) })
		h.u64(uint64(len(entries)))
		for _, d := range entries {
			h.buf = append(h.buf, d[:]...)
		}
	case reflect.Func, reflect.Chan, reflect.UnsafePointer:
		if *(*unsafe.Pointer)(ptr) == nil {
			h.buf = append(h.buf, 8)
		} else {
			h.buf = append(h.buf, 9)
		}
	default:
		panic("explore: cannot digest a " + p.kind.String())
	}
}

type sliceHeader struct {
	data     unsafe.Pointer
	len, cap int
}
