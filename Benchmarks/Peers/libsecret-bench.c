/* libsecret in-process, the peer that scripts/compare-peers measures Lockbox against: stores
 * then reads N small passwords with the synchronous libsecret API (what secret-tool and most
 * C/GLib applications use), timing each call. Prints {"store": [ns...], "read": [ns...]}.
 *
 *   cc libsecret-bench.c $(pkg-config --cflags --libs libsecret-1) -o libsecret-bench
 *   libsecret-bench N SERVICE
 */
#include <libsecret/secret.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const SecretSchema schema = {
    "org.lockbox.PeerBenchmark", SECRET_SCHEMA_DONT_MATCH_NAME,
    {{"service", SECRET_SCHEMA_ATTRIBUTE_STRING}, {"account", SECRET_SCHEMA_ATTRIBUTE_STRING}, {NULL, 0}}};

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void print_array(const char *name, unsigned long long *values, int count, int last) {
    printf("\"%s\": [", name);
    for (int i = 0; i < count; i++) printf(i ? ",%llu" : "%llu", values[i]);
    printf(last ? "]" : "], ");
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: libsecret-bench N SERVICE\n"); return 64; }
    int count = atoi(argv[1]);
    const char *service = argv[2];
    unsigned long long *stores = calloc(count, sizeof *stores), *reads = calloc(count, sizeof *reads);
    char account[64], secret[96];
    GError *error = NULL;
    for (int i = 0; i < count; i++) {
        snprintf(account, sizeof account, "account-%d", i);
        snprintf(secret, sizeof secret, "secret-value-%d-0123456789abcdef", i);
        unsigned long long start = now_ns();
        if (!secret_password_store_sync(&schema, SECRET_COLLECTION_DEFAULT, "peer benchmark", secret, NULL, &error,
                                        "service", service, "account", account, NULL)) {
            fprintf(stderr, "store failed: %s\n", error ? error->message : "?");
            return 1;
        }
        stores[i] = now_ns() - start;
    }
    for (int i = 0; i < count; i++) {
        snprintf(account, sizeof account, "account-%d", i);
        unsigned long long start = now_ns();
        gchar *value = secret_password_lookup_sync(&schema, NULL, &error, "service", service, "account", account, NULL);
        reads[i] = now_ns() - start;
        if (!value) { fprintf(stderr, "lookup failed for %s\n", account); return 1; }
        secret_password_free(value);
    }
    for (int i = 0; i < count; i++) {
        snprintf(account, sizeof account, "account-%d", i);
        secret_password_clear_sync(&schema, NULL, NULL, "service", service, "account", account, NULL);
    }
    printf("{");
    print_array("store", stores, count, 0);
    print_array("read", reads, count, 1);
    printf("}\n");
    return 0;
}
