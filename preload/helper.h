/* helper.c: the peer-notification helper's start (package peernotify). */
#ifndef VMAXDP_HELPER_H
#define VMAXDP_HELPER_H

/* vmx_spawn_detached starts path with argv and an empty environment, fd
 * as its fd 3, stdin and stdout on /dev/null, in a session of its own,
 * as a process whose parent is init, not the caller (peernotify.SpawnFunc).
 * It returns the process's id, or a negated errno. */
int vmx_spawn_detached(const char *path, char *const argv[], int fd);

/* vmx_library_path is the path this library was loaded from, or NULL. */
const char *vmx_library_path(void);

#endif
