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
 *
 * Execute: the plain or donating call of a host program (see pb_execute), Python's for
 * every other.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { size_t struct_size; void* extension_start; void* object; } DestroyArgs;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void** queue;
static size_t capacity;
size_t pb_pending;  /* read by Python without a call: nonzero means "drain me" */

static int destroyed_in_c(void** object);

/* Queue ``entry`` for Python, which takes entries in order: a handle jaxlib destroyed, or,
 * tagged in its low bits (blocks and data are aligned), what a donating native Execute left
 * to Python: CONSUMED, a buffer of Python's to delete (its handle stays jaxlib's); LENT, one
 * to delete whose memory an output made here now holds (Python keeps the array alive); and
 * RETURNED, the data address of lent memory that no buffer made here holds any more. */
enum { CONSUMED = 1, LENT = 2, RETURNED = 3 };
static void defer(void* entry) {
  pthread_mutex_lock(&lock);
  if (pb_pending == capacity) {
    size_t grown = capacity ? 2 * capacity : 1024;
    void** bigger = realloc(queue, grown * sizeof(void*));
    if (!bigger) { pthread_mutex_unlock(&lock); return; }  /* leak rather than fail */
    queue = bigger;
    capacity = grown;
  }
  queue[pb_pending++] = entry;
  pthread_mutex_unlock(&lock);
}

void* pb_defer_destroy(DestroyArgs* args) {
  if (!destroyed_in_c(args->object)) defer(args->object);
  return NULL;
}

size_t pb_take(void** out, size_t max) {
  pthread_mutex_lock(&lock);
  size_t n = pb_pending < max ? pb_pending : max;
  memcpy(out, queue, n * sizeof(void*));
  memmove(queue, queue + n, (pb_pending - n) * sizeof(void*));
  pb_pending -= n;
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
enum { TAG_BUFFER = 0x70620001, TAG_EXECUTABLE = 0x70620002, TAG_MEMORY = 0x70620003, TAG_READY = 0x70620004,
       TAG_LOADED = 0x70620005 };
enum { BUFFER_DEVICE, BUFFER_MEMORY, BUFFER_IS_DELETED, BUFFER_READY_EVENT, EVENT_IS_READY, EVENT_ON_READY,
       EXECUTABLE_NUM_OUTPUTS, MEMORY_KIND, LOADED_EXECUTE, GETTERS };
/* Words of a buffer's block: the getters' (device, memory, deleted, ready event), its data's
 * address, and who made it: Python (0; READ_ONLY where compiled code may not write its memory,
 * a caller's host array), C and unknown to Python yet (MADE_IN_C, or BORROWED: over memory
 * that a buffer of Python's lent at a donation), or C then adopted. */
enum { WORD_DEVICE = 2, WORD_MEMORY, WORD_DELETED, WORD_READY, WORD_DATA, WORD_ORIGIN };
enum { MADE_IN_C = 0x70620010, ADOPTED = 0x70620011, BORROWED = 0x70620012, READ_ONLY = 0x70620013 };

/* A buffer's block that C made and Python has not adopted (a NativeBuffer, below). */
static int made_in_c(void** b) {
  return (size_t)b[WORD_ORIGIN] == MADE_IN_C || (size_t)b[WORD_ORIGIN] == BORROWED;
}

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

/* Execute, the call of a host program, without entering Python: the plan (below) says the
 * program has no token outputs or host callbacks, and an entry taking bare pointers; Python
 * leaves other programs without one. When anything else differs from the plain case (several
 * devices, another argument count, an argument that is not a live host buffer of the
 * executable's device, a donated buffer passed twice or listed as not donatable, memory that
 * cannot be had) Python's Execute runs the call: it reports what is wrong as every PJRT
 * error is reported.
 *
 * Donation, as pjrt/executable.py does it: a donated input is deleted after the call; an
 * output computed in an input's memory (``alias``) is handed that memory, no copy. A buffer
 * made here hands it on itself; a buffer of Python's lends it (LENT, in the queue above),
 * unless it is READ_ONLY: then the code writes a copy, as it does for written inputs that are
 * not donated. Python deletes its consumed buffers on its next callback. */
typedef struct { int32_t type; int32_t rank; size_t nbytes; const int64_t* dims; int64_t alias; } Output;
enum { DONATED = 1, OVERWRITTEN = 2 };  /* an Input's flags: consumed by a call; written by the code */
typedef struct { size_t nbytes; int64_t flags; } Input;
typedef struct {
  void (*entry)(void);
  int64_t packed;  /* whether entry takes one pointer to its pointers (any count), else them one by one */
  void* device; void* memory; void* ready_event;
  size_t num_inputs, num_outputs, arena_bytes;
  void* idle_arena;  /* kept between calls; a call that finds none (another thread's) allocates one */
  const Output* outputs;
  const Input* inputs;  /* NULL: no input is donated or written */
} Plan;

/* A buffer made here: a handle block (handles.py) of origin MADE_IN_C, then what Python reads
 * to adopt it on the first callback that names it (type, rank, bytes, dims). Destroy frees a
 * buffer never adopted at once; an adopted one is Python's to release. */
typedef struct { void* words[8]; int32_t type; int32_t rank; size_t nbytes; int64_t dims[]; } NativeBuffer;

/* PJRT_ExecuteOptions up to the inputs that jaxlib says may not be donated. */
typedef struct {
  size_t struct_size; void* extension_start; void* send_callbacks; void* recv_callbacks;
  size_t num_send_ops, num_recv_ops; int launch_id;
  const int64_t* non_donatable_input_indices; size_t num_non_donatable_input_indices;
} ExecuteOptions;

typedef struct {
  size_t struct_size; void* extension_start; void** executable; const ExecuteOptions* options;
  void** const* argument_lists; size_t num_devices; size_t num_args; void** const* output_lists;
  void** device_complete_events; void* execute_device;
} ExecuteArgs;

/* Words of a device's block: word 7 counts the bytes of its buffers made here and not
 * adopted (Python counts the others for PJRT_Device_MemoryStats). */
enum { DEVICE_NATIVE_BYTES = 7 };
const size_t pb_max_pointers = 20;

static size_t rounded(size_t nbytes) {
  return nbytes ? (nbytes + 63) & ~(size_t)63 : 64;
}

static void* aligned(size_t nbytes) {
  void* data = NULL;
  return posix_memalign(&data, 64, rounded(nbytes)) ? NULL : data;
}

/* Outputs of at least pb_pool_min bytes (set by Python: cpu/array_pool.py's threshold): malloc
 * may serve them from a fresh mapping, faulted in page by page on every call (array_pool.py
 * measures it), so a freed one waits here for the next output of its size; at most
 * POOL_IDLE_BYTES wait, the oldest dropped first. */
enum { POOL_SLOTS = 32 };
#define POOL_IDLE_BYTES ((size_t)256 << 20)
size_t pb_pool_min = (size_t)1 << 20;
static struct { size_t nbytes; void* data; } pool[POOL_SLOTS];
static size_t pool_count, pool_bytes;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static void pool_remove(size_t i) {
  pool_bytes -= pool[i].nbytes;
  memmove(&pool[i], &pool[i + 1], (--pool_count - i) * sizeof pool[0]);
}

static void* take_output(size_t nbytes) {
  size_t size = rounded(nbytes);
  if (size >= pb_pool_min) {
    pthread_mutex_lock(&pool_lock);
    for (size_t i = pool_count; i-- > 0;) {
      if (pool[i].nbytes == size) {
        void* data = pool[i].data;
        pool_remove(i);
        pthread_mutex_unlock(&pool_lock);
        return data;
      }
    }
    pthread_mutex_unlock(&pool_lock);
  }
  return aligned(nbytes);
}

void pb_give_back(void* data, size_t nbytes) {
  size_t size = rounded(nbytes);
  if (size < pb_pool_min || size > POOL_IDLE_BYTES) {
    free(data);
    return;
  }
  pthread_mutex_lock(&pool_lock);
  while (pool_count && (pool_count == POOL_SLOTS || pool_bytes + size > POOL_IDLE_BYTES)) {
    free(pool[0].data);
    pool_remove(0);
  }
  pool[pool_count].nbytes = size;
  pool[pool_count++].data = data;
  pool_bytes += size;
  pthread_mutex_unlock(&pool_lock);
}

static void count_bytes(void** device, size_t nbytes, int sign) {
  if (sign > 0) __atomic_add_fetch((size_t*)&device[DEVICE_NATIVE_BYTES], nbytes, __ATOMIC_RELAXED);
  else __atomic_sub_fetch((size_t*)&device[DEVICE_NATIVE_BYTES], nbytes, __ATOMIC_RELAXED);
}

/* A buffer for ``output`` over ``data`` (its origin ``origin``), or over fresh memory where
 * ``data`` is NULL. */
static NativeBuffer* new_buffer(const Plan* plan, const Output* output, void* data, size_t origin) {
  NativeBuffer* b = malloc(sizeof(NativeBuffer) + output->rank * sizeof(int64_t));
  if (b && !data && !(data = take_output(output->nbytes))) { free(b); b = NULL; }
  if (!b) return NULL;
  void* words[8] = {NULL, (void*)(size_t)TAG_BUFFER, plan->device, plan->memory, NULL, plan->ready_event, data,
                    (void*)origin};
  memcpy(b->words, words, sizeof words);
  b->type = output->type;
  b->rank = output->rank;
  b->nbytes = output->nbytes;
  memcpy(b->dims, output->dims, output->rank * sizeof(int64_t));
  count_bytes(plan->device, output->nbytes, 1);
  return b;
}

static void release_data(NativeBuffer* b) {
  if (!b->words[WORD_DATA]) return;  /* consumed: handed on */
  if ((size_t)b->words[WORD_ORIGIN] == BORROWED) defer((void*)((size_t)b->words[WORD_DATA] | RETURNED));
  else pb_give_back(b->words[WORD_DATA], b->nbytes);
}

static void free_buffer(NativeBuffer* b) {
  count_bytes(b->words[WORD_DEVICE], b->nbytes, -1);
  release_data(b);
  free(b);
}

/* A buffer of a call that cannot go on, its memory freed where ``owned`` (not an input's). */
static void unmake(NativeBuffer* b, int owned) {
  if (owned) {
    free_buffer(b);
  } else {
    count_bytes(b->words[WORD_DEVICE], b->nbytes, -1);
    free(b);
  }
}

/* Donation of a buffer made here: deleted, its memory handed on (``keep``) or given back. */
static void consume(NativeBuffer* b, int keep) {
  count_bytes(b->words[WORD_DEVICE], b->nbytes, -1);
  if (!keep) release_data(b);
  b->words[WORD_DATA] = NULL;
  b->nbytes = 0;
  b->words[WORD_DELETED] = (void*)1;
}

/* Destroy of the shared ready event (immortal) or of a buffer never adopted: done here. */
static int destroyed_in_c(void** object) {
  if (!object) return 0;
  if ((size_t)object[1] == TAG_READY) return 1;
  if ((size_t)object[1] != TAG_BUFFER || !made_in_c(object)) return 0;
  free_buffer((NativeBuffer*)object);
  return 1;
}

/* Python adopts a buffer made here: from then on the device's count is Python's (and lent
 * memory Python's again). */
void pb_adopted(NativeBuffer* b) {
  b->words[WORD_ORIGIN] = (void*)(size_t)ADOPTED;
  count_bytes(b->words[WORD_DEVICE], b->nbytes, -1);
}

void pb_free(void* memory) {
  free(memory);
}

/* A copy of ``spec`` that lives until pb_free_plan (its outputs stay the caller's). */
Plan* pb_new_plan(const Plan* spec) {
  Plan* plan = malloc(sizeof(Plan));
  if (plan) *plan = *spec;
  return plan;
}

void pb_free_plan(Plan* plan) {
  free(plan->idle_arena);
  free(plan);
}

/* The entry with n pointer arguments, for a library without a packed entry: one case per
 * count, up to pb_max_pointers. */
#define P1 void*
#define P2 P1, void*
#define P3 P2, void*
#define P4 P3, void*
#define P5 P4, void*
#define P6 P5, void*
#define P7 P6, void*
#define P8 P7, void*
#define P9 P8, void*
#define P10 P9, void*
#define P11 P10, void*
#define P12 P11, void*
#define P13 P12, void*
#define P14 P13, void*
#define P15 P14, void*
#define P16 P15, void*
#define P17 P16, void*
#define P18 P17, void*
#define P19 P18, void*
#define P20 P19, void*
#define A1 a[0]
#define A2 A1, a[1]
#define A3 A2, a[2]
#define A4 A3, a[3]
#define A5 A4, a[4]
#define A6 A5, a[5]
#define A7 A6, a[6]
#define A8 A7, a[7]
#define A9 A8, a[8]
#define A10 A9, a[9]
#define A11 A10, a[10]
#define A12 A11, a[11]
#define A13 A12, a[12]
#define A14 A13, a[13]
#define A15 A14, a[14]
#define A16 A15, a[15]
#define A17 A16, a[16]
#define A18 A17, a[17]
#define A19 A18, a[18]
#define A20 A19, a[19]
#define CALL(n) case n: ((void (*)(P##n))entry)(A##n); return

static void call_entry(void (*entry)(void), void* const* a, size_t n) {
  switch (n) {
    case 0: ((void (*)(void))entry)(); return;
    CALL(1); CALL(2); CALL(3); CALL(4); CALL(5); CALL(6); CALL(7); CALL(8); CALL(9); CALL(10);
    CALL(11); CALL(12); CALL(13); CALL(14); CALL(15); CALL(16); CALL(17); CALL(18); CALL(19); CALL(20);
  }
}

/* Called before each native call where set: the host's choice of parallel teams (cpu/teams.c). */
void (*pb_before_call)(void);

/* Whether a call with ``args`` may donate as the plan says: jaxlib lists no input as not
 * donatable, and no donated buffer is passed twice. */
static int may_donate(const Plan* plan, const ExecuteArgs* args) {
  const ExecuteOptions* options = args->options;
  if (options && options->struct_size > offsetof(ExecuteOptions, num_non_donatable_input_indices)
      && options->num_non_donatable_input_indices)
    return 0;
  void* const* buffers = args->argument_lists[0];  /* the plan has inputs: there are arguments */
  for (size_t i = 0; i < plan->num_inputs; i++)
    if (plan->inputs[i].flags & DONATED)
      for (size_t j = 0; j < plan->num_inputs; j++)
        if (j != i && buffers[j] == buffers[i]) return 0;
  return 1;
}

/* The memory the code writes for each written input: the buffer's own where it is donated
 * and not READ_ONLY, else a copy (in ``copies``); 0 where memory cannot be had. */
static int written_memory(const Plan* plan, void* const* buffers, void** pointers, void** copies) {
  for (size_t i = 0; i < plan->num_inputs; i++) {
    int64_t flags = plan->inputs[i].flags;
    if (!(flags & OVERWRITTEN) || ((flags & DONATED) && (size_t)((void**)buffers[i])[WORD_ORIGIN] != READ_ONLY))
      continue;
    if (!(copies[i] = take_output(plan->inputs[i].nbytes))) return 0;
    memcpy(copies[i], pointers[i], plan->inputs[i].nbytes);
    pointers[i] = copies[i];
  }
  return 1;
}

/* After the call: donated inputs deleted, copies not handed to an output given back. */
static void settle_donation(const Plan* plan, void* const* buffers, void** copies, const int* aliased) {
  for (size_t i = 0; i < plan->num_inputs; i++) {
    if (copies[i] && !aliased[i]) pb_give_back(copies[i], plan->inputs[i].nbytes);
    if (!(plan->inputs[i].flags & DONATED)) continue;
    void** b = buffers[i];
    if (made_in_c(b)) {
      consume((NativeBuffer*)b, aliased[i]);
    } else {
      b[WORD_DELETED] = (void*)1;
      defer((void*)((size_t)b | (aliased[i] && !copies[i] ? LENT : CONSUMED)));
    }
  }
}

void* pb_execute(ExecuteArgs* args) {
  void** handle = args->executable;
  if (!handle || (size_t)handle[1] != TAG_LOADED || !handle[2]) return pb_python[LOADED_EXECUTE](args);
  const Plan* plan = handle[2];
  if (args->num_devices != 1 || args->num_args != plan->num_inputs
      || (args->execute_device && args->execute_device != plan->device))
    return pb_python[LOADED_EXECUTE](args);
  void* pointers[plan->num_inputs + plan->num_outputs + 1];  /* inputs, fresh outputs, arena */
  NativeBuffer* made[plan->num_outputs + 1];
  void* copies[plan->num_inputs + 1];  /* per input: the copy the code writes instead */
  int aliased[plan->num_inputs + 1];   /* per input: whether an output holds its memory */
  memset(copies, 0, sizeof copies);
  memset(aliased, 0, sizeof aliased);
  void* const* buffers = plan->num_inputs ? args->argument_lists[0] : NULL;  /* jaxlib may pass no lists */
  size_t n = 0, k, i;
  for (; n < plan->num_inputs; n++) {
    void** b = buffers[n];
    if (!b || (size_t)b[1] != TAG_BUFFER || b[WORD_DEVICE] != plan->device || b[WORD_DELETED] || !b[WORD_DATA])
      return pb_python[LOADED_EXECUTE](args);
    pointers[n] = b[WORD_DATA];
  }
  if (plan->inputs && !may_donate(plan, args)) return pb_python[LOADED_EXECUTE](args);
  void* arena = NULL;
  if (plan->inputs && !written_memory(plan, buffers, pointers, copies)) goto fail;
  if (plan->arena_bytes) {
    arena = __atomic_exchange_n((void**)&plan->idle_arena, NULL, __ATOMIC_ACQ_REL);
    if (!arena && !(arena = aligned(plan->arena_bytes))) goto fail;
  }
  for (k = 0; k < plan->num_outputs; k++) {
    int64_t alias = plan->outputs[k].alias;
    size_t origin = alias < 0 || copies[alias] ? MADE_IN_C
                    : made_in_c(buffers[alias]) ? (size_t)((void**)buffers[alias])[WORD_ORIGIN] : BORROWED;
    if (!(made[k] = new_buffer(plan, &plan->outputs[k], alias < 0 ? NULL : pointers[alias], origin))) {
      while (k--) unmake(made[k], plan->outputs[k].alias < 0);
      goto fail;
    }
    if (alias < 0) pointers[n++] = made[k]->words[WORD_DATA];
    else aliased[alias] = 1;
  }
  if (arena) pointers[n++] = arena;
  if (pb_before_call) pb_before_call();
  if (plan->packed) ((void (*)(void**))plan->entry)(pointers);
  else call_entry(plan->entry, pointers, n);
  void* none = NULL;
  if (arena && !__atomic_compare_exchange_n((void**)&plan->idle_arena, &none, arena, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
    free(arena);
  if (plan->inputs) settle_donation(plan, buffers, copies, aliased);
  for (k = 0; k < plan->num_outputs; k++) args->output_lists[0][k] = made[k];
  if (args->device_complete_events) *args->device_complete_events = plan->ready_event;
  return NULL;
fail:
  for (i = 0; i < plan->num_inputs; i++) free(copies[i]);
  free(arena);
  return pb_python[LOADED_EXECUTE](args);
}
