/* How parallel regions share the cores, chosen before each call from how busy the machine is.
 *
 * On a quiet machine: libomp's load-balance teams (OMP_DYNAMIC with KMP_DYNAMIC_MODE set by
 * cpu/executable.py) and workers that spin between regions, ready at once for the next one.
 * Where other processes keep the cores busy (more runnable tasks than cores), those teams
 * shrink to the calling thread alone, which then never sleeps: the kernel's scheduler gives a
 * task that stays runnable only its fair share, and the program runs several times slower
 * than one whose threads sleep and wake between pieces of work, as XLA's pool does. So then
 * every region gets a full team whose workers sleep at its end (blocktime 0).
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

void pb_teams_init(int host_cores, int blocktime_ms, const char* loadavg_path) {
  cores = host_cores;
  quiet_blocktime = blocktime_ms;
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
  if (b == busy) return;
  busy = b;
  omp_set_dynamic(!b);
  kmp_set_blocktime(b ? 0 : quiet_blocktime);
}
