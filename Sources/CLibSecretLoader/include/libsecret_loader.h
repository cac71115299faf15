// libsecret and the parts of GLib that Lockbox calls, reached through dlopen instead of the
// link line: a process that never uses the Secret Service never maps libsecret, GIO, GObject
// or GLib, and a binary starts on a machine that has none of them.
//
// The declarations follow libsecret's and GLib's documented, stable ABI (libsecret-1.so.0,
// GLib 2.x on LP64 Linux). Only what Lockbox uses is declared: the object types are opaque,
// the one struct is GError, whose fields GLib documents as public, and each enum lists only
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
typedef struct _SecretItem SecretItem;
typedef struct _SecretValue SecretValue;
typedef struct _GVariant GVariant;
/// A GVariant type string such as "(a{sv})", passed as GLib's G_VARIANT_TYPE macro does: the
/// string's address, cast.
typedef struct _GVariantType GVariantType;

/// A failure report (gerror.h); freed with g_error_free.
typedef struct _GError {
    GQuark domain;
    gint code;
    gchar *_Nullable message;
} GError;

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
    SECRET_ITEM_NONE = 0,
} SecretItemFlags;

typedef enum {
    G_DBUS_CALL_FLAGS_NONE = 0,
} GDBusCallFlags;

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

    // libsecret: items by object path, without a proxy per item (secret-paths.h)
    gchar *_Nullable (*_Nonnull secret_service_create_item_dbus_path_sync)(
        SecretService *self, const gchar *collection_path, GHashTable *properties, SecretValue *value,
        SecretItemCreateFlags flags, GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    GHashTable *_Nullable (*_Nonnull secret_service_get_secrets_for_dbus_paths_sync)(
        SecretService *self, const gchar *_Nullable const *_Nonnull item_paths,
        GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    gboolean (*_Nonnull secret_service_delete_item_dbus_path_sync)(
        SecretService *self, const gchar *item_path, GCancellable *_Nullable cancellable,
        GError *_Nullable *_Nullable error);

    // libsecret: item proxies, for updates (secret-item.h, secret-paths.h)
    SecretItem *_Nullable (*_Nonnull secret_item_new_for_dbus_path_sync)(
        SecretService *_Nullable service, const gchar *item_path, SecretItemFlags flags,
        GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
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
    void (*_Nonnull g_dbus_connection_set_exit_on_close)(GDBusConnection *connection, gboolean exit_on_close);
    gboolean (*_Nonnull g_dbus_connection_is_closed)(GDBusConnection *connection);
    GVariant *_Nullable (*_Nonnull g_dbus_connection_call_sync)(
        GDBusConnection *connection, const gchar *_Nullable bus_name, const gchar *object_path,
        const gchar *interface_name, const gchar *method_name, GVariant *_Nullable parameters,
        const GVariantType *_Nullable reply_type, GDBusCallFlags flags, gint timeout_msec,
        GCancellable *_Nullable cancellable, GError *_Nullable *_Nullable error);
    gchar *_Nullable (*_Nonnull g_dbus_error_get_remote_error)(const GError *error);
    GQuark (*_Nonnull g_io_error_quark)(void);

    // GObject
    void (*_Nonnull g_object_unref)(gpointer object);

    // GLib: variants (gvariant.h), the values of D-Bus messages
    GVariant *_Nonnull (*_Nonnull g_variant_new_string)(const gchar *string);
    GVariant *_Nonnull (*_Nonnull g_variant_new_variant)(GVariant *value);
    GVariant *_Nonnull (*_Nonnull g_variant_new_dict_entry)(GVariant *key, GVariant *value);
    GVariant *_Nonnull (*_Nonnull g_variant_new_array)(
        const GVariantType *_Nullable child_type, GVariant *_Nonnull const *_Nullable children, gsize count);
    GVariant *_Nonnull (*_Nonnull g_variant_new_tuple)(GVariant *_Nonnull const *_Nullable children, gsize count);
    GVariant *_Nonnull (*_Nonnull g_variant_ref)(GVariant *value);
    GVariant *_Nonnull (*_Nonnull g_variant_ref_sink)(GVariant *value);
    // Declared with a nullable argument so that it also serves as a GDestroyNotify.
    void (*_Nonnull g_variant_unref)(gpointer _Nullable value);
    const gchar *_Nonnull (*_Nonnull g_variant_get_type_string)(GVariant *value);
    gsize (*_Nonnull g_variant_n_children)(GVariant *value);
    GVariant *_Nonnull (*_Nonnull g_variant_get_child_value)(GVariant *value, gsize index);
    GVariant *_Nonnull (*_Nonnull g_variant_get_variant)(GVariant *value);
    const gchar *_Nonnull (*_Nonnull g_variant_get_string)(GVariant *value, gsize *_Nullable length);
    gboolean (*_Nonnull g_variant_get_boolean)(GVariant *value);
    guint64 (*_Nonnull g_variant_get_uint64)(GVariant *value);

    // GLib: memory, strings, hash tables, errors
    void (*_Nonnull g_free)(gpointer _Nullable memory);
    gchar *_Nullable (*_Nonnull g_strdup)(const gchar *_Nullable string);
    guint (*_Nonnull g_str_hash)(gconstpointer string);
    gboolean (*_Nonnull g_str_equal)(gconstpointer a, gconstpointer b);
    GHashTable *_Nonnull (*_Nonnull g_hash_table_new_full)(
        GHashFunc hash, GEqualFunc equal, GDestroyNotify _Nullable destroy_key,
        GDestroyNotify _Nullable destroy_value);
    gboolean (*_Nonnull g_hash_table_insert)(GHashTable *table, gpointer _Nullable key, gpointer _Nullable value);
    gpointer _Nullable (*_Nonnull g_hash_table_lookup)(GHashTable *table, gconstpointer key);
    void (*_Nonnull g_hash_table_unref)(GHashTable *table);
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
