/* A compile worker ends when its parent does, even in the middle of a compile.
 *
 * The worker learns of its parent's end by the end of its job pipe, but reads that pipe only
 * between jobs, and a compile holds Python's lock for seconds (MLIR's pass manager), so no
 * Python thread could watch it. This thread of C waits on the pipe for a hang-up alone (no
 * read: the jobs stay the worker's) and ends the process when every writer is gone: the
 * parent exited, was killed, or closed the pipe (then the worker had no job left anyway).
 * PR_SET_PDEATHSIG is no substitute: it fires when the *thread* that started the worker
 * ends, and jobs arrive from JAX's threads.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

static void* watch(void* arg) {
  struct pollfd pipe_end = {(int)(intptr_t)arg, 0, 0};  /* no events asked: POLLHUP and errors only */
  for (;;) {
    int ready = poll(&pipe_end, 1, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready > 0 && (pipe_end.revents & POLLHUP)) _exit(3);
    return NULL;  /* not a pipe we can watch: the worker ends between jobs as before */
  }
}

int pb_exit_with_parent(int job_fd) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, watch, (void*)(intptr_t)job_fd)) return -1;
  return pthread_detach(thread);
}
