// libsecret and the parts of GLib that Lockbox calls, reached through dlopen instead of the
// link line: a process that never uses the Secret Service never maps libsecret, GIO, GObject
// or GLib, and a binary starts on a machine that has none of them.
//
// The declarations follow libsecret's and GLib's documented, stable ABI (libsecret-1.so.0,
// GLib 2.x on LP64 Linux). Only what Lockbox uses is declared: the object types are opaque,
// the structs are the three whose fields GLib documents as public, and each enum lists only
// the values Lockbox compares against or passes.
#ifndef LOCKBOX_LIBSECRET_LOADER_H
#define LOCKBOX_LIBSECRET_LOADER_H

#include <stddef.h>
#include <stdint.h>

#pragma clang assume_nonnull begin

// GLib's basic types, as glibconfig.h defines them for x86_64 and aarch64 Linux (where
// size_t is unsigned long and ssize_t is long).
typedef char gchar;
typedef int gint;
typedef int gboolean;
typedef unsigned int guint;
typedef size_t gsize;
typedef long gssize;
typedef unsigned long guint64;
typedef void *gpointer;
typedef const void *gconstpointer;
typedef uint32_t GQuark;
typedef gsize GType;

typedef guint (*GHashFunc)(gconstpointer key);
typedef gboolean (*GEqualFunc)(gconstpointer a, gconstpointer b);
typedef void (*GDestroyNotify)(gpointer _Nullable data);

// Instances only ever handled through pointers.
typedef struct _GHashTable GHashTable;
typedef struct _GCancellable GCancellable;
typedef struct _GDBusProxy GDBusProxy;
typedef struct _GDBusConnection GDBusConnection;
typedef struct _SecretSchema SecretSchema;
typedef struct _SecretService SecretService;
typedef struct _SecretCollection SecretCollection;
typedef struct _SecretItem SecretItem;
typedef struct _SecretValue SecretValue;

/// A failure report (gerror.h); freed with g_error_free.
typedef struct _GError {
    GQuark domain;
    gint code;
    gchar *_Nullable message;
} GError;

/// A doubly linked list node (glist.h).
typedef struct _GList {
    gpointer _Nullable data;
    struct _GList *_Nullable next;
    struct _GList *_Nullable prev;
} GList;

/// An iterator over a GHashTable, allocated by the caller (ghash.h). Its fields are private;
/// only the size and alignment are the ABI.
typedef struct _GHashTableIter {
    gpointer _Nullable reserved_pointers[3];
    int reserved_int;
    gboolean reserved_boolean;
    gpointer _Nullable reserved_pointer;
} GHashTableIter;

/// Codes of the G_IO_ERROR domain (gioenums.h) that Lockbox tells apart.
typedef enum {
    G_IO_ERROR_NOT_FOUND = 1,
    G_IO_ERROR_CLOSED = 18,
    G_IO_ERROR_CANCELLED = 19,
    G_IO_ERROR_TIMED_OUT = 24,
    G_IO_ERROR_CONNECTION_REFUSED = 39,
    G_IO_ERROR_BROKEN_PIPE = 44,
    G_IO_ERROR_CONNECTION_CLOSED = G_IO_ERROR_BROKEN_PIPE,
} GIOErrorEnum;

/// Codes of the SECRET_ERROR domain (secret-types.h) that Lockbox tells apart.
typedef enum {
    SECRET_ERROR_IS_LOCKED = 2,
    SECRET_ERROR_NO_SUCH_OBJECT = 3,
} SecretError;

typedef enum {
    SECRET_SERVICE_NONE = 0,
} SecretServiceFlags;

typedef enum {
    SECRET_COLLECTION_NONE = 0,
} SecretCollectionFlags;

typedef enum {
    SECRET_SEARCH_ALL = 1 << 1,
} SecretSearchFlags;

typedef enum {
    SECRET_ITEM_CREATE_NONE = 0,
    SECRET_ITEM_CREATE_REPLACE = 1 << 1,
} SecretItemCreateFlags;

/// Every libsecret and GLib function Lockbox calls, resolved from libsecret-1.so.0 and the
/// GLib libraries it depends on. Each field is named after the function it points to; the
/// signatures are the documented ones.
struct lockbox_libsecret {
    // libsecret: the service (secret-service.h, secret-paths.h)
    GType (*_Nonnull secret_service_get_type)(void);
    SecretService *_Nullable (*_Nonnull secret_service_open_sync)(
        GType service_gtype, const gchar *_Nullable service_bus_name, SecretServiceFlags flags,
        GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    gchar *_Nullable (*_Nonnull secret_service_read_alias_dbus_path_sync)(
        SecretService *self, const gchar *alias, GCancellable *_Nullable cancellable,
        GError *_Nullable *_Nullable error);
    GQuark (*_Nonnull secret_error_get_quark)(void);

    // libsecret: collections (secret-collection.h, secret-paths.h)
    SecretCollection *_Nullable (*_Nonnull secret_collection_new_for_dbus_path_sync)(
        SecretService *_Nullable service, const gchar *collection_path, SecretCollectionFlags flags,
        GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    gboolean (*_Nonnull secret_collection_get_locked)(SecretCollection *self);
    gchar *_Nullable (*_Nonnull secret_collection_get_label)(SecretCollection *self);
    GList *_Nullable (*_Nonnull secret_collection_search_sync)(
        SecretCollection *self, const SecretSchema *_Nullable schema, GHashTable *attributes,
        SecretSearchFlags flags, GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);

    // libsecret: items (secret-item.h)
    SecretItem *_Nullable (*_Nonnull secret_item_create_sync)(
        SecretCollection *collection, const SecretSchema *_Nullable schema, GHashTable *attributes,
        const gchar *label, SecretValue *value, SecretItemCreateFlags flags,
        GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    gboolean (*_Nonnull secret_item_delete_sync)(
        SecretItem *self, GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    gboolean (*_Nonnull secret_item_get_locked)(SecretItem *self);
    GHashTable *_Nullable (*_Nonnull secret_item_get_attributes)(SecretItem *self);
    gchar *_Nullable (*_Nonnull secret_item_get_label)(SecretItem *self);
    guint64 (*_Nonnull secret_item_get_created)(SecretItem *self);
    guint64 (*_Nonnull secret_item_get_modified)(SecretItem *self);
    gboolean (*_Nonnull secret_item_load_secret_sync)(
        SecretItem *self, GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    SecretValue *_Nullable (*_Nonnull secret_item_get_secret)(SecretItem *self);
    gboolean (*_Nonnull secret_item_set_attributes_sync)(
        SecretItem *self, const SecretSchema *_Nullable schema, GHashTable *attributes,
        GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    gboolean (*_Nonnull secret_item_set_label_sync)(
        SecretItem *self, const gchar *label, GCancellable *_Nullable cancellable,
        GError *_Nullable *_Nullable error);
    gboolean (*_Nonnull secret_item_set_secret_sync)(
        SecretItem *self, SecretValue *value, GCancellable *_Nullable cancellable,
        GError *_Nullable *_Nullable error);

    // libsecret: values (secret-value.h)
    SecretValue *_Nonnull (*_Nonnull secret_value_new)(const gchar *secret, gssize length, const gchar *content_type);
    const gchar *_Nullable (*_Nonnull secret_value_get)(SecretValue *value, gsize *_Nullable length);
    void (*_Nonnull secret_value_unref)(gpointer value);

    // GIO: cancellation, D-Bus, errors
    GCancellable *_Nonnull (*_Nonnull g_cancellable_new)(void);
    void (*_Nonnull g_cancellable_cancel)(GCancellable *_Nullable cancellable);
    gboolean (*_Nonnull g_cancellable_is_cancelled)(GCancellable *_Nullable cancellable);
    GDBusConnection *_Nullable (*_Nonnull g_dbus_proxy_get_connection)(GDBusProxy *proxy);
    const gchar *_Nonnull (*_Nonnull g_dbus_proxy_get_object_path)(GDBusProxy *proxy);
    void (*_Nonnull g_dbus_connection_set_exit_on_close)(GDBusConnection *connection, gboolean exit_on_close);
    gboolean (*_Nonnull g_dbus_connection_is_closed)(GDBusConnection *connection);
    gchar *_Nullable (*_Nonnull g_dbus_error_get_remote_error)(const GError *error);
    GQuark (*_Nonnull g_io_error_quark)(void);

    // GObject
    void (*_Nonnull g_object_unref)(gpointer object);

    // GLib: memory, strings, hash tables, lists, errors
    void (*_Nonnull g_free)(gpointer _Nullable memory);
    gchar *_Nullable (*_Nonnull g_strdup)(const gchar *_Nullable string);
    guint (*_Nonnull g_str_hash)(gconstpointer string);
    gboolean (*_Nonnull g_str_equal)(gconstpointer a, gconstpointer b);
    GHashTable *_Nonnull (*_Nonnull g_hash_table_new_full)(
        GHashFunc hash, GEqualFunc equal, GDestroyNotify _Nullable destroy_key,
        GDestroyNotify _Nullable destroy_value);
    gboolean (*_Nonnull g_hash_table_insert)(GHashTable *table, gpointer _Nullable key, gpointer _Nullable value);
    void (*_Nonnull g_hash_table_unref)(GHashTable *table);
    void (*_Nonnull g_hash_table_iter_init)(GHashTableIter *iterator, GHashTable *table);
    gboolean (*_Nonnull g_hash_table_iter_next)(
        GHashTableIter *iterator, gpointer _Nullable *_Nullable key, gpointer _Nullable *_Nullable value);
    void (*_Nonnull g_list_free)(GList *_Nullable list);
    void (*_Nonnull g_error_free)(GError *error);
};

/// The library lockbox_libsecret_load opens: libsecret's runtime package (libsecret-1-0 on
/// Debian and Ubuntu) installs it.
#define LOCKBOX_LIBSECRET_LIBRARY "libsecret-1.so.0"

/// Opens `library` (RTLD_NOW | RTLD_LOCAL) and resolves every function of the table from it
/// and its dependencies.
///
/// Returns a table that stays valid for the life of the process (the library is never
/// closed), or NULL after writing a message that names the library or the missing function
/// into `error` (`size` bytes, always NUL-terminated). Safe to call from any thread.
const struct lockbox_libsecret *_Nullable lockbox_libsecret_open(const char *library, char *error, size_t size);

/// lockbox_libsecret_open(LOCKBOX_LIBSECRET_LIBRARY), done once per process: later calls
/// return the first call's table, or copy its message into `error` again.
const struct lockbox_libsecret *_Nullable lockbox_libsecret_load(char *error, size_t size);

#pragma clang assume_nonnull end

#endif
