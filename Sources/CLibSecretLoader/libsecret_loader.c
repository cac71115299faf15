#include "libsecret_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Where each function goes in the table, by the name dlsym looks up.
#define FUNCTION(name) { #name, offsetof(struct lockbox_libsecret, name) }

static const struct {
    const char *name;
    size_t offset;
} functions[] = {
    FUNCTION(secret_service_get_type),
    FUNCTION(secret_service_open_sync),
    FUNCTION(secret_service_read_alias_dbus_path_sync),
    FUNCTION(secret_error_get_quark),
    FUNCTION(secret_service_create_item_dbus_path_sync),
    FUNCTION(secret_service_get_secrets_for_dbus_paths_sync),
    FUNCTION(secret_service_delete_item_dbus_path_sync),
    FUNCTION(secret_item_new_for_dbus_path_sync),
    FUNCTION(secret_item_set_secret_sync),
    FUNCTION(secret_value_new),
    FUNCTION(secret_value_get),
    FUNCTION(secret_value_unref),
    FUNCTION(g_cancellable_new),
    FUNCTION(g_cancellable_cancel),
    FUNCTION(g_cancellable_is_cancelled),
    FUNCTION(g_dbus_proxy_get_connection),
    FUNCTION(g_dbus_connection_set_exit_on_close),
    FUNCTION(g_dbus_connection_is_closed),
    FUNCTION(g_dbus_connection_call_sync),
    FUNCTION(g_dbus_error_get_remote_error),
    FUNCTION(g_io_error_quark),
    FUNCTION(g_object_unref),
    FUNCTION(g_variant_new_string),
    FUNCTION(g_variant_new_variant),
    FUNCTION(g_variant_new_dict_entry),
    FUNCTION(g_variant_new_array),
    FUNCTION(g_variant_new_tuple),
    FUNCTION(g_variant_ref),
    FUNCTION(g_variant_ref_sink),
    FUNCTION(g_variant_unref),
    FUNCTION(g_variant_get_type_string),
    FUNCTION(g_variant_n_children),
    FUNCTION(g_variant_get_child_value),
    FUNCTION(g_variant_get_variant),
    FUNCTION(g_variant_get_string),
    FUNCTION(g_variant_get_boolean),
    FUNCTION(g_variant_get_uint64),
    FUNCTION(g_free),
    FUNCTION(g_strdup),
    FUNCTION(g_str_hash),
    FUNCTION(g_str_equal),
    FUNCTION(g_hash_table_new_full),
    FUNCTION(g_hash_table_insert),
    FUNCTION(g_hash_table_lookup),
    FUNCTION(g_hash_table_unref),
    FUNCTION(g_error_free),
};

// The table holds nothing but function pointers, so this catches a field without an entry.
_Static_assert(
    sizeof functions / sizeof functions[0] == sizeof(struct lockbox_libsecret) / sizeof(void (*)(void)),
    "every function in struct lockbox_libsecret is resolved");

const struct lockbox_libsecret *lockbox_libsecret_open(const char *library, char *error, size_t size) {
    // RTLD_NOW: a library missing one of its own dependencies fails here, not at a later call.
    // RTLD_LOCAL: GLib's symbols do not become visible to libraries loaded afterwards.
    void *handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *reason = dlerror();
        snprintf(error, size, "%s", reason != NULL ? reason : library);
        return NULL;
    }
    struct lockbox_libsecret *table = calloc(1, sizeof *table);
    if (table == NULL) {
        snprintf(error, size, "out of memory while loading %s", library);
        dlclose(handle);
        return NULL;
    }
    for (size_t index = 0; index < sizeof functions / sizeof functions[0]; index++) {
        // A handle's lookup covers the library and its dependencies (GIO, GObject, GLib).
        void *symbol = dlsym(handle, functions[index].name);
        if (symbol == NULL) {
            snprintf(error, size, "%s does not provide the function %s", library, functions[index].name);
            free(table);
            dlclose(handle);
            return NULL;
        }
        // POSIX guarantees that dlsym's result converts to the function's pointer type.
        memcpy((char *)table + functions[index].offset, &symbol, sizeof symbol);
    }
    // The handle stays open for the rest of the process: GObject types cannot be unloaded.
    return table;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const struct lockbox_libsecret *loaded;
static char failure[512];

static void load_once(void) {
    loaded = lockbox_libsecret_open(LOCKBOX_LIBSECRET_LIBRARY, failure, sizeof failure);
}

const struct lockbox_libsecret *lockbox_libsecret_load(char *error, size_t size) {
    pthread_once(&once, load_once);
    if (loaded == NULL) {
        snprintf(error, size, "%s", failure);
    }
    return loaded;
}
