//go:build cgo

package verbs

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>

// The few entry points used, declared here so that building needs no
// rdma-core headers.
struct ibv_device;
typedef struct ibv_device **(*vmx_get_list_fn)(int *);
typedef void (*vmx_free_list_fn)(struct ibv_device **);
typedef const char *(*vmx_get_name_fn)(struct ibv_device *);

static vmx_get_list_fn vmx_get_list;
static vmx_free_list_fn vmx_free_list;
static vmx_get_name_fn vmx_get_name;

// vmx_ibv_load opens libibverbs once; NULL when it is loaded, else why not.
static const char *vmx_ibv_load(void)
{
	if (vmx_get_list)
		return NULL;
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return dlerror();
	vmx_get_name = (vmx_get_name_fn)dlsym(h, "ibv_get_device_name");
	vmx_free_list = (vmx_free_list_fn)dlsym(h, "ibv_free_device_list");
	vmx_get_list = (vmx_get_list_fn)dlsym(h, "ibv_get_device_list");
	if (!vmx_get_name || !vmx_free_list || !vmx_get_list) {
		vmx_get_list = NULL;
		return "ibv_get_device_list, ibv_free_device_list or ibv_get_device_name missing";
	}
	return NULL;
}

// vmx_ibv_devices writes the devices' names into buf, one per line; the
// length written, or -errno.
static int vmx_ibv_devices(char *buf, int len)
{
	int n = 0, off = 0;
	struct ibv_device **list = vmx_get_list(&n);
	if (!list)
		return -errno;
	for (int i = 0; i < n && off < len; i++) {
		int k = snprintf(buf + off, len - off, "%s\n", vmx_get_name(list[i]));
		if (k < 0)
			break;
		off += k;
	}
	vmx_free_list(list);
	return off < len ? off : len;
}
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

var loadMu sync.Mutex

// Devices loads libibverbs (once) and returns the names of the RDMA
// devices it lists.
func Devices() ([]string, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if why := C.vmx_ibv_load(); why != nil {
		return nil, fmt.Errorf("%w: %s (apt-get install libibverbs1 ibverbs-providers)", ErrNoLibrary, C.GoString(why))
	}
	var buf [4096]byte
	n := C.vmx_ibv_devices((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)))
	switch errno := syscall.Errno(-n); {
	case errno == syscall.ENOSYS:
		return nil, fmt.Errorf("%w: ibv_get_device_list: %w (the kernel has no RDMA support: /sys/class/infiniband_verbs absent)", ErrNoDevice, errno)
	case n < 0:
		return nil, fmt.Errorf("ibv_get_device_list: %w", errno)
	}
	return strings.Fields(string(buf[:n])), nil
}
