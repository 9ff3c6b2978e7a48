package needle

/*
#include <stdint.h>
#include <stddef.h>
*/
import "C"

import (
	"sync"
)

// callbackContext is what a Generate call's token callback needs. C only ever sees its
// registry handle (an integer), never a Go pointer.
type callbackContext struct {
	fn         func(token uint32, text string) bool
	panicked   bool
	panicValue interface{}
}

var registry = struct {
	sync.Mutex
	next uintptr
	m    map[uintptr]*callbackContext
}{m: map[uintptr]*callbackContext{}}

func register(c *callbackContext) uintptr {
	registry.Lock()
	defer registry.Unlock()
	registry.next++ // never 0: 0 means "no callback"
	registry.m[registry.next] = c
	return registry.next
}

func unregister(h uintptr) {
	registry.Lock()
	delete(registry.m, h)
	registry.Unlock()
}

func lookup(h uintptr) *callbackContext {
	registry.Lock()
	defer registry.Unlock()
	return registry.m[h]
}

// needleGoToken is called by wrap.c's trampoline for each generated token. It returns non-zero
// to stop; a panic is recovered here (it must not unwind through C) and re-raised by Generate.
//
//export needleGoToken
func needleGoToken(token C.uint32_t, text *C.char, n C.size_t, handle C.uintptr_t) (stop C.int) {
	ctx := lookup(uintptr(handle))
	if ctx == nil || ctx.panicked {
		return 1
	}
	defer func() {
		if v := recover(); v != nil {
			ctx.panicked, ctx.panicValue = true, v
			stop = 1
		}
	}()
	piece := C.GoStringN(text, C.int(n))
	if ctx.fn(uint32(token), piece) {
		return 1
	}
	return 0
}
