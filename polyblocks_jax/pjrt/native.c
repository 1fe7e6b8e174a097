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
 *
 * Getters: the other questions jaxlib asks on every call, answered from the handle's block.
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

/* Every PJRT_*_Args below begins {size_t struct_size; void* extension_start; void* object},
 * then the answer's fields. */
typedef struct { size_t struct_size; void* extension_start; void** object; void* answer; } PointerArgs;
typedef struct { size_t struct_size; void* extension_start; void** object; _Bool answer; } FlagArgs;
typedef struct { size_t struct_size; void* extension_start; void** object; size_t answer; } SizeArgs;
typedef struct { size_t struct_size; void* extension_start; void** object; void* kind; size_t kind_size; } KindArgs;
typedef struct { size_t struct_size; void* extension_start; void** object;
                 void (*callback)(void* error, void* user_arg); void* user_arg; } OnReadyArgs;

/* PJRT_Executable_NumReplicas and _NumPartitions. */
void* pb_one(SizeArgs* args) {
  args->answer = 1;
  return NULL;
}

/* Getters (a buffer's device, memory, deletion and ready event; an event's readiness, error
 * and callback; an executable's output count; a memory's kind) read the handle's block
 * (pjrt/handles.py): word 0 stays 0 for jaxlib's probe, word 1 is a tag saying what words
 * 2.. hold, written by Python with the object. Without the tag (a GPU buffer's pending
 * event, a null handle) the Python callback of the same function answers. */
enum { TAG_BUFFER = 0x70620001, TAG_EXECUTABLE = 0x70620002, TAG_MEMORY = 0x70620003, TAG_READY = 0x70620004 };
enum { BUFFER_DEVICE, BUFFER_MEMORY, BUFFER_IS_DELETED, BUFFER_READY_EVENT, EVENT_IS_READY, EVENT_ON_READY,
       EXECUTABLE_NUM_OUTPUTS, MEMORY_KIND, GETTERS };

typedef void* (*Callback)(void* args);
Callback pb_python[GETTERS];  /* set by the plugin */

#define TAGGED(args, tag) ((args)->object && (size_t)(args)->object[1] == (tag))
#define OR_PYTHON(args, tag, getter) if (!TAGGED(args, tag)) return pb_python[getter](args)

void* pb_buffer_device(PointerArgs* args) {
  OR_PYTHON(args, TAG_BUFFER, BUFFER_DEVICE);
  args->answer = args->object[2];
  return NULL;
}

void* pb_buffer_memory(PointerArgs* args) {
  OR_PYTHON(args, TAG_BUFFER, BUFFER_MEMORY);
  args->answer = args->object[3];
  return NULL;
}

void* pb_buffer_is_deleted(FlagArgs* args) {
  OR_PYTHON(args, TAG_BUFFER, BUFFER_IS_DELETED);
  args->answer = args->object[4] != NULL;
  return NULL;
}

void* pb_buffer_ready_event(PointerArgs* args) {
  if (!TAGGED(args, TAG_BUFFER) || !args->object[5]) return pb_python[BUFFER_READY_EVENT](args);
  args->answer = args->object[5];
  return NULL;
}

void* pb_event_is_ready(FlagArgs* args) {
  OR_PYTHON(args, TAG_READY, EVENT_IS_READY);
  args->answer = 1;
  return NULL;
}

void* pb_event_on_ready(OnReadyArgs* args) {
  OR_PYTHON(args, TAG_READY, EVENT_ON_READY);
  args->callback(NULL, args->user_arg);
  return NULL;
}

void* pb_executable_num_outputs(SizeArgs* args) {
  OR_PYTHON(args, TAG_EXECUTABLE, EXECUTABLE_NUM_OUTPUTS);
  args->answer = (size_t)args->object[2];
  return NULL;
}

void* pb_memory_kind(KindArgs* args) {
  OR_PYTHON(args, TAG_MEMORY, MEMORY_KIND);
  args->kind = args->object[2];
  args->kind_size = (size_t)args->object[3];
  return NULL;
}

/* Events never carry errors: a failure is the result of the call that would have made one. */
void* pb_no_error(void* args) {
  (void)args;
  return NULL;
}
