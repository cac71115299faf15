#include "tss2_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

// The libraries, by their versioned names (Debian: libtss2-esys-3.0.2-0, libtss2-tctildr0,
// libtss2-mu0, libtss2-rc0).
static const char *const libraries[] = {
    "libtss2-tctildr.so.0",
    "libtss2-esys.so.0",
    "libtss2-mu.so.0",
    "libtss2-rc.so.0",
};
#define LIBRARY_COUNT (sizeof libraries / sizeof libraries[0])

// Where each function goes in the table, by the name dlsym looks up.
#define FUNCTION(name) { #name, offsetof(struct lockbox_tss2, name) }

static const struct {
    const char *name;
    size_t offset;
} functions[] = {
    FUNCTION(Tss2_TctiLdr_Initialize),
    FUNCTION(Tss2_TctiLdr_Finalize),
    FUNCTION(Esys_Initialize),
    FUNCTION(Esys_Finalize),
    FUNCTION(Esys_Free),
    FUNCTION(Esys_CreatePrimary),
    FUNCTION(Esys_Create),
    FUNCTION(Esys_Load),
    FUNCTION(Esys_FlushContext),
    FUNCTION(Esys_Sign),
    FUNCTION(Esys_Unseal),
    FUNCTION(Esys_PCR_Extend),
    FUNCTION(Esys_StartAuthSession),
    FUNCTION(Esys_PolicyPCR),
    FUNCTION(Esys_PolicyGetDigest),
    FUNCTION(Esys_GetCapability),
    FUNCTION(Esys_TR_FromTPMPublic),
    FUNCTION(Tss2_MU_TPM2B_PUBLIC_Marshal),
    FUNCTION(Tss2_MU_TPM2B_PUBLIC_Unmarshal),
    FUNCTION(Tss2_MU_TPM2B_PRIVATE_Marshal),
    FUNCTION(Tss2_MU_TPM2B_PRIVATE_Unmarshal),
    FUNCTION(Tss2_RC_Decode),
};

// The table holds nothing but function pointers, so this catches a field without an entry.
_Static_assert(
    sizeof functions / sizeof functions[0] == sizeof(struct lockbox_tss2) / sizeof(void (*)(void)),
    "every function in struct lockbox_tss2 is resolved");

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct lockbox_tss2 table;
static const struct lockbox_tss2 *loaded;
static char failure[512];

static void load_once(void) {
    void *handles[LIBRARY_COUNT] = {0};
    for (size_t index = 0; index < LIBRARY_COUNT; index++) {
        // RTLD_NOW: a library missing one of its own dependencies fails here, not at a later
        // call. RTLD_LOCAL: their symbols (and libcrypto's) stay out of the global scope.
        handles[index] = dlopen(libraries[index], RTLD_NOW | RTLD_LOCAL);
        if (handles[index] == NULL) {
            const char *reason = dlerror();
            snprintf(failure, sizeof failure, "the TPM library %s cannot be loaded (%s); install Debian's tss2 libraries "
                     "(libtss2-esys-3.0.2-0 libtss2-tctildr0 libtss2-mu0 libtss2-rc0)",
                     libraries[index], reason != NULL ? reason : "not found");
            return;
        }
    }
    for (size_t index = 0; index < sizeof functions / sizeof functions[0]; index++) {
        void *symbol = NULL;
        for (size_t library = 0; library < LIBRARY_COUNT && symbol == NULL; library++) {
            symbol = dlsym(handles[library], functions[index].name);
        }
        if (symbol == NULL) {
            snprintf(failure, sizeof failure, "the TPM libraries do not provide the function %s", functions[index].name);
            return;
        }
        // POSIX guarantees that dlsym's result converts to the function's pointer type.
        memcpy((char *)&table + functions[index].offset, &symbol, sizeof symbol);
    }
    // The handles stay open for the rest of the process: ESAPI contexts point into them.
    loaded = &table;
}

const struct lockbox_tss2 *lockbox_tss2_load(char *error, size_t size) {
    pthread_once(&once, load_once);
    if (loaded == NULL) {
        snprintf(error, size, "%s", failure);
    }
    return loaded;
}
