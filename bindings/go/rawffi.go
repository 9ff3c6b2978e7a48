package needle

/*
#include "needle.h"
*/
import "C"

// Direct calls of needle.h with no wrapper, used by the tests (cgo is not allowed in _test.go
// files) to compare the safe API with the raw C functions.

func rawCheckABI(v uint32) int32 { return int32(C.needle_check_abi(C.uint32_t(v))) }

// rawDecode creates a state with needle_state_create, feeds token with needle_state_decode and
// returns the logits and the status.
func rawDecode(m *Model, token uint32) ([]float32, int32) {
	var s *C.needle_state
	if st := C.needle_state_create(m.ptr, &s); st != 0 {
		return nil, int32(st)
	}
	defer C.needle_state_free(s)
	logits := make([]float32, m.info.OutVocab)
	st := C.needle_state_decode(s, C.uint32_t(token), (*C.float)(&logits[0]), C.size_t(len(logits)))
	return logits, int32(st)
}
