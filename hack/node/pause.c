/* The pod sandbox's process: holds the pod's namespaces until the kubelet stops it, and reaps
 * any child that ends up with it. Built static (musl) into the local pause image. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) { (void)signal; exit(0); }

static void reap(int signal) {
  (void)signal;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
