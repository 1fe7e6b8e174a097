/* Native functions of the polyblocks PJRT plugin, in C.
 *
 * Destroy: jaxlib destroys arrays while Python unwinds an exception; a ctypes callback run
 * at that moment loses the pending exception (CPython checks every call's result against
 * the error indicator). So Destroy only queues the handle here, without entering
 * Python; the plugin releases queued handles on its next callback.
 * Every PJRT_*_Destroy_Args is {size_t struct_size; void* extension_start; void* object}.
 *
 * One: the answers that are always 1 (replicas, partitions), asked twice each per call;
 * a callback into Python costs about 0.3 us each.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct { size_t struct_size; void* extension_start; void* object; } DestroyArgs;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void** queue;
static size_t capacity;
size_t pb_pending;  /* read by Python without a call: nonzero means "drain me" */

void* pb_defer_destroy(DestroyArgs* args) {
  pthread_mutex_lock(&lock);
  if (pb_pending == capacity) {
    size_t grown = capacity ? 2 * capacity : 1024;
    void** bigger = realloc(queue, grown * sizeof(void*));
    if (!bigger) { pthread_mutex_unlock(&lock); return NULL; }  /* leak rather than fail */
    queue = bigger;
    capacity = grown;
  }
  queue[pb_pending++] = args->object;
  pthread_mutex_unlock(&lock);
  return NULL;
}

size_t pb_take(void** out, size_t max) {
  pthread_mutex_lock(&lock);
  size_t n = pb_pending < max ? pb_pending : max;
  pb_pending -= n;
  memcpy(out, queue + pb_pending, n * sizeof(void*));
  pthread_mutex_unlock(&lock);
  return n;
}

/* PJRT_Executable_NumReplicas_Args and _NumPartitions_Args:
 * {size_t struct_size; void* extension_start; void* executable; size_t count}. */
typedef struct { size_t struct_size; void* extension_start; void* executable; size_t count; } CountArgs;

void* pb_one(CountArgs* args) {
  args->count = 1;
  return NULL;
}
