/* How parallel regions share the cores, chosen before each call from how busy the machine is.
 *
 * On a quiet machine: libomp's load-balance teams (OMP_DYNAMIC with KMP_DYNAMIC_MODE set by
 * cpu/executable.py) and workers that spin between regions, ready at once for the next one.
 * Where other processes keep the cores busy (more runnable tasks than cores), those teams
 * shrink to the calling thread alone, which then never sleeps: the kernel's scheduler gives a
 * task that stays runnable only its fair share, and the program runs several times slower
 * than one whose threads sleep and wake between pieces of work, as XLA's pool does. So then
 * every region gets a full team whose workers sleep at its end (blocktime 0), and a region
 * whose work would not pay for waking a sleeping worker runs on the calling thread alone:
 * compiled code compares each region's estimated work with pb_min_parallel_work, whose
 * address its library's global polyblocks_parallel_min_work holds (cpu/parallel_if.py).
 *
 * The load is read from /proc/loadavg at most every 100 ms per thread; libomp keeps both
 * settings per calling thread, hence the thread-local state. The omp_ and kmp_ functions
 * resolve against libomp, loaded globally before this library.
 */
#include <stdio.h>
#include <time.h>

void omp_set_dynamic(int dynamic);
void kmp_set_blocktime(int milliseconds);

static int cores = 1;
static int quiet_blocktime = 200;  /* libomp's default, in ms */
static char loadavg[256] = "/proc/loadavg";
static long long busy_min_work = 0;
/* The least estimated work of a region that runs in parallel now: one value for the whole
 * process, since the load it follows is the machine's. */
volatile long long pb_min_parallel_work = 0;

void pb_teams_init(int host_cores, int blocktime_ms, long long busy_min_parallel_work, const char* loadavg_path) {
  cores = host_cores;
  quiet_blocktime = blocktime_ms;
  busy_min_work = busy_min_parallel_work;
  snprintf(loadavg, sizeof loadavg, "%s", loadavg_path);
}

/* The runnable tasks of the whole machine right now: the numerator of /proc/loadavg's fourth
 * field, which counts the reading thread itself; 0 where it cannot be read. */
static int runnable_tasks(void) {
  FILE* f = fopen(loadavg, "r");
  if (!f) return 0;
  double one, five, fifteen;
  int running = 0, total = 0;
  if (fscanf(f, "%lf %lf %lf %d/%d", &one, &five, &fifteen, &running, &total) != 5) running = 0;
  fclose(f);
  return running;
}

void pb_teams_choose(void) {
  static __thread long long next_check_ns;
  static __thread int busy = -1;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long long ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
  if (ns < next_check_ns) return;
  next_check_ns = ns + 100000000LL;
  int b = runnable_tasks() > cores;
  pb_min_parallel_work = b ? busy_min_work : 0;
  if (b == busy) return;
  busy = b;
  omp_set_dynamic(!b);
  kmp_set_blocktime(b ? 0 : quiet_blocktime);
}
