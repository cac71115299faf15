// Tests never write into the real home. Before any test (and before the Swift runtime starts a
// thread, so setenv is safe), every process that links the test support gets a fresh private
// home under /tmp: HOME and XDG_STATE_HOME, XDG_DATA_HOME, XDG_CONFIG_HOME, XDG_CACHE_HOME
// point into it, and every program a test starts inherits them. The default device key, the
// remembered generations and the login-session markers therefore land there. A process whose
// parent already made one (LOCKBOX_TEST_HOME set) keeps it, so a test's helper processes share
// their test's state. The tree is removed when the process that made it exits.
#define _GNU_SOURCE
#include "test_isolation.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char home[64];
static char original_home[4096];
static pid_t creator;

const char *lockbox_test_home(void) { return home[0] ? home : NULL; }
const char *lockbox_test_original_home(void) { return original_home; }

static int remove_entry(const char *path, const struct stat *status, int flag, struct FTW *walk) {
    (void)status; (void)flag; (void)walk;
    remove(path);
    return 0;
}

static void remove_home(void) {
    // Only the process that made the tree removes it (a forked child that exits must not).
    if (getpid() == creator && home[0]) nftw(home, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_directory(const char *path) {
    if (mkdir(path, 0700) != 0) {
        fprintf(stderr, "lockbox tests: cannot create %s for the temporary home\n", path);
        _exit(70);
    }
}

__attribute__((constructor)) static void lockbox_isolate_home(void) {
    const char *inherited = getenv("LOCKBOX_TEST_HOME");
    const char *current = getenv("HOME");
    snprintf(original_home, sizeof original_home, "%s", getenv("LOCKBOX_TEST_ORIGINAL_HOME") ? getenv("LOCKBOX_TEST_ORIGINAL_HOME") : (current ? current : ""));
    if (inherited && *inherited && current && strcmp(inherited, current) == 0) {
        snprintf(home, sizeof home, "%s", inherited);
        return;
    }
    snprintf(home, sizeof home, "/tmp/lockbox-test-home-XXXXXX");
    if (!mkdtemp(home)) {
        fprintf(stderr, "lockbox tests: mkdtemp failed for the temporary home\n");
        _exit(70);
    }
    creator = getpid();
    atexit(remove_home);
    static const char *const directories[][2] = {
        {NULL, "/.local"},
        {"XDG_STATE_HOME", "/.local/state"},
        {"XDG_DATA_HOME", "/.local/share"},
        {"XDG_CONFIG_HOME", "/.config"},
        {"XDG_CACHE_HOME", "/.cache"},
    };
    char path[128];
    for (size_t index = 0; index < sizeof directories / sizeof directories[0]; index++) {
        snprintf(path, sizeof path, "%s%s", home, directories[index][1]);
        make_directory(path);
        if (directories[index][0]) setenv(directories[index][0], path, 1);
    }
    setenv("LOCKBOX_TEST_ORIGINAL_HOME", original_home, 1);
    setenv("LOCKBOX_TEST_HOME", home, 1);
    setenv("HOME", home, 1);
}
