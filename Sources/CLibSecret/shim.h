// The object-path API (secret-paths.h) has been unchanged since libsecret 0.7; Lockbox uses it to open a collection by path.
#define SECRET_API_SUBJECT_TO_CHANGE 1
#include <libsecret/secret.h>
