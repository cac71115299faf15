/// Help text for `lockbox --help` and `lockbox VERB --help`.
package enum Help {
    package static let overview = """
        usage: lockbox [--keychain PATH] [--backend vault|secret-service] COMMAND [OPTIONS]

        A keychain for Linux: secrets encrypted at rest, with the Keychain's item classes,
        accessibility classes and status codes.

        Keychain:
          init                       create a keychain protected by a passphrase
          unlock                     unlock it (keys cached in the kernel keyring)
          lock                       lock it: whenUnlocked items become unreadable
          status                     lock state, readable classes, unlock methods
          verify                     check the whole file against what Lockbox wrote
          change-passphrase          replace the passphrase and rotate the keys
          remove-passphrase          unlock without one on this machine (deletes passcode-bound items)
          set-passphrase             set one again
          enroll secret-service      let the desktop keyring unlock it with your login session
          enroll tpm2 [--pcrs 7]     let the TPM unlock it with no passphrase (a service at boot)
          enroll tpm2 --device-key   seal this machine's device key (ThisDeviceOnly items) by the TPM
          backup FILE                write the portable items to a sealed backup file
          restore FILE               merge a backup into this keychain (newer copy wins)
        Items:
          add-generic-password       store a secret under a service and account
          find-generic-password      find one; -w prints only the secret
          delete-generic-password    delete the matching items (--all when naming none)
          add-internet-password      the same for a server, protocol, port and path
          find-internet-password
          delete-internet-password
          dump                       list every item's attributes (never secrets)
        Keys (run by lockbox-keys):
          generate-key               make a key for a purpose (--hardware: inside the TPM)
          sign                       sign standard input with a key
          public-key                 print a key's public half (PEM, DER, X9.63, OpenSSH)
          delete-key                 delete a key
        OAuth 2.0:
          login                      sign in (device flow, or --browser)
          token                      print a fresh access token (for scripts)
          logout                     revoke the tokens and forget the session
          auth status                who is signed in (never a token)
        SSH:
          ssh-agent                  serve the keychain's SSH keys to ssh, ssh-add and git
        Sync:
          sync                       synchronizable items end-to-end encrypted through PostgreSQL
        Broker:
          broker status              whether lockboxd runs, its pid, keychain and lock state
          broker stop                stop lockboxd once the requests it is answering are done
          broker install-units       let systemd start lockboxd on the first connection
          broker uninstall-units     remove those units

        The keychain is PATH, else $LOCKBOX_KEYCHAIN, else $XDG_DATA_HOME/lockbox/default.lockbox.
        The backend is --backend, else $LOCKBOX_BACKEND, else the vault (`lockbox status` says why).
        Secrets are read from standard input or asked on the terminal, never from arguments.
        Text on standard input loses one trailing newline (\\n or \\r\\n) and nothing else; --raw
        (add, find -w) keeps the exact bytes in and out. Empty secrets are refused.
        Exit status: 0 ok, 1 failure, 44 item not found, 64 usage error.
        `lockbox COMMAND --help` describes a command.
        """

    package static func text(for verb: String) -> String? {
        switch verb {
        case "init":
            return """
                usage: lockbox [--keychain PATH] init [--passphrase-stdin] [--kdf moderate|interactive|sensitive]

                Creates the keychain file (mode 0600 in a 0700 directory) and leaves it unlocked.
                  --passphrase-stdin   read the passphrase from the first line of standard input
                                       (otherwise it is asked twice on the terminal)
                  --kdf STRENGTH       Argon2id strength: moderate (default, 256 MiB), sensitive
                                       (1 GiB), or interactive (64 MiB, the weakest allowed)
                """
        case "unlock":
            return """
                usage: lockbox [--keychain PATH] unlock [--passphrase-stdin | --tpm2] [--timeout SECONDS]

                Unlocks the keychain for this user's processes until `lockbox lock`, the idle
                timeout, or reboot. Keys are kept in the kernel keyring, never on disk.
                  --passphrase-stdin   read the passphrase from the first line of standard input
                                       (otherwise it is asked on the terminal, three tries)
                  --tpm2               unlock with the TPM slot (`lockbox enroll tpm2`), no passphrase
                  --timeout SECONDS    lock again after this much inactivity (default 900; 0 never)
                """
        case "lock":
            return """
                usage: lockbox [--keychain PATH] lock [--all]

                Locks the keychain: whenUnlocked items read as locked (OSStatus -25308) in every
                process. afterFirstUnlock items stay readable until reboot, unless --all is given.
                """
        case "verify":
            return """
                usage: lockbox [--keychain PATH] verify [--accept-older] [--json]

                Checks the whole keychain file: the integrity record, every row against it, every
                readable item, and the file's write generation against the one this machine
                remembers. Exit status 0 when sound, 1 otherwise, with what failed. A file older
                than remembered (an older copy put in place, a lost write-ahead log) is refused by
                every command; after restoring an older copy on purpose, `verify --accept-older`
                accepts it when it is otherwise sound. Needs the first unlock since boot.
                """
        case "status":
            return """
                usage: lockbox [--keychain PATH] status [--json]

                Shows the backend and why it was chosen, the lock state, which accessibility
                classes are readable now, the unlock methods and the item count. Never a secret.
                """
        case "change-passphrase":
            return """
                usage: lockbox [--keychain PATH] change-passphrase [--passphrase-stdin]

                Replaces the passphrase and rotates the keys: a new master key and new class keys,
                and every item is resealed, so an old copy of the file with the old passphrase
                opens nothing written afterwards. A desktop-keyring unlock held the old key and is
                removed (enroll it again). With --passphrase-stdin the old passphrase is the first
                line of standard input and the new one the second.
                """
        case "add-generic-password", "add-internet-password":
            return """
                usage: lockbox [--keychain PATH] \(verb) -s \(verb.hasSuffix("internet-password") ? "SERVER" : "SERVICE") -a ACCOUNT [OPTIONS]

                Stores a secret read from standard input or, on a terminal, asked twice without
                echo. The secret is never accepted as an argument. Standard input is text: exactly
                one trailing "\\n" or "\\r\\n" is removed (what `echo` adds), nothing else.
                  --raw                store standard input byte for byte (binary secrets, keys)
                  --allow-empty        store an empty secret (otherwise refused)
                  -a ACCOUNT           account name
                  -s \(verb.hasSuffix("internet-password") ? "SERVER    " : "SERVICE   ")        \(verb.hasSuffix("internet-password") ? "server name" : "service name")
                  -l LABEL             label;  -j COMMENT  comment;  -D KIND  description
                \(verb.hasSuffix("internet-password") ? "  -r PROTOCOL -P PORT -p PATH -d DOMAIN -t AUTHTYPE\n" : "")  -U                   update the item if it already exists
                  --accessibility A    when it can be read: whenUnlocked (default), afterFirstUnlock,
                                       whenUnlockedThisDeviceOnly, afterFirstUnlockThisDeviceOnly,
                                       whenPasscodeSetThisDeviceOnly, always, alwaysThisDeviceOnly
                  --access-group G     the access group (a namespace, not an isolation boundary)
                  --access-control C   userPresence or devicePasscode: every read asks for the
                                       passphrase again (on the terminal)
                  --synchronizable     an item `lockbox sync` carries to the group's other
                                       devices, end-to-end encrypted (not with a ThisDeviceOnly
                                       accessibility or access control, which stay here)
                """
        case "find-generic-password", "find-internet-password":
            return """
                usage: lockbox [--keychain PATH] \(verb) [-s NAME] [-a ACCOUNT]\(verb.hasSuffix("internet-password") ? " [-r PROTOCOL] [-P PORT] [-p PATH] [-d DOMAIN] [-t AUTHTYPE]" : "") [--synchronizable] [-w [--raw] | --json]

                Finds the first matching item. Prints its attributes, or with -w only the secret
                followed by a newline; with -w --raw only the secret's bytes, no newline.
                --synchronizable matches only synchronizable items (otherwise both kinds).\(verb.hasSuffix("internet-password") ? "\nAn attribute not given matches any value: name the port (-P) to tell apart items\nof one server and account on different ports." : "")
                Exit status 44 when nothing matches.
                """
        case "delete-generic-password", "delete-internet-password":
            return """
                usage: lockbox [--keychain PATH] \(verb) [-s NAME] [-a ACCOUNT]\(verb.hasSuffix("internet-password") ? " [-r PROTOCOL] [-P PORT] [-p PATH] [-d DOMAIN] [-t AUTHTYPE]" : "") [--synchronizable] [--all]

                Deletes every matching item and says how many (with --synchronizable, only
                synchronizable ones; otherwise both kinds). An attribute not given matches any
                value\(verb.hasSuffix("internet-password") ? " (without -P, the items of every port of the server and account)" : ""). A delete that names no attribute
                would delete every item of the class: it is refused (status 64) unless --all is
                given; --all also deletes the keys of a sync group this keychain is in (join it
                again afterwards). An item whose class is locked is not deleted (OSStatus
                -25308): while the keychain is locked, only items of the classes open since the
                first unlock (afterFirstUnlock, always) can be. Exit status 44 when nothing matches.
                """
        case "backup":
            return """
                usage: lockbox [--keychain PATH] backup FILE [--passphrase-stdin] [--replace]

                Writes the portable items (whenUnlocked, afterFirstUnlock, always) to FILE, sealed
                with a key from the backup passphrase (Argon2id). ThisDeviceOnly and
                access-controlled items never leave this machine. Consistent while other
                processes write. --passphrase-stdin reads the backup passphrase from stdin.
                FILE must not exist: --replace replaces an earlier backup, never another file
                (the keychain itself, its device key).
                """
        case "restore":
            return """
                usage: lockbox [--keychain PATH] restore FILE [--passphrase-stdin]

                Merges a backup into this keychain: new items are added; for an item that exists,
                the more recently modified copy wins, and on a tie the existing one stays.
                """
        case "generate-key":
            return """
                usage: lockbox [--keychain PATH] generate-key --tag TAG [--label LABEL] [--algorithm ALG]
                       [--purpose PURPOSES] [--hardware] [--accessibility CLASS] [--synchronizable] [--json]

                Makes a key and prints its public half (PEM). The private key never leaves
                Lockbox: no command prints it, and backups leave it out.
                  --algorithm       p256 (default), ed25519, x25519, aes256GCM
                  --purpose         sign, verify, encrypt, decrypt, key-agreement (comma-separated;
                                    default: all the algorithm can have)
                  --hardware        make a P-256 sign/verify key inside the TPM 2.0; fails when
                                    there is none (never a software key instead)
                  --synchronizable  the key goes, sealed end to end, to the other devices of this
                                    keychain's sync group (`lockbox sync`); a software key with an
                                    accessibility without ThisDeviceOnly only
                """
        case "sign":
            return """
                usage: lockbox [--keychain PATH] sign --tag TAG [--label LABEL] [--raw]

                Signs standard input with the key: ECDSA P-256 with SHA-256 (DER) or Ed25519.
                Prints the signature in base64; --raw writes its bytes.
                """
        case "public-key":
            return """
                usage: lockbox [--keychain PATH] public-key --tag TAG [--label LABEL] [--format pem|der|x963|openssh]

                Prints the key's public half: PEM (default), DER or X9.63 bytes, or an
                authorized_keys line.
                """
        case "delete-key":
            return """
                usage: lockbox [--keychain PATH] delete-key --tag TAG [--label LABEL] [--all]

                Deletes the key with that tag (and label, when given; --label "" names the key
                without one). When several match, nothing is deleted unless --all is given.
                """
        case "enroll", "unenroll":
            return """
                usage: lockbox [--keychain PATH] \(verb) secret-service
                       lockbox [--keychain PATH] enroll tpm2 [--pcrs 0,7]   |   unenroll tpm2
                       lockbox enroll tpm2 --device-key [--pcrs 0,7]

                tpm2: seals a key that unlocks this keychain with the machine's TPM 2.0 (and with
                --pcrs, to those PCRs' current values), kept in the keychain file. `lockbox unlock
                --tpm2` then unlocks with no passphrase and no desktop session (a service at boot,
                like systemd-cryptenroll --tpm2-device). A copy of the file opens on no other
                machine. LOCKBOX_TPM_TCTI names another TPM (swtpm:path=SOCKET).

                tpm2 --device-key: seals this machine's device key (which binds the ThisDeviceOnly
                items of every keychain) by the TPM, in place of the clear key file: the same key,
                so nothing stored changes, but a copy of the file opens those items on no other
                machine. Without the TPM they read as unavailable, never from a key file.
                `lockbox status` says where the device key lives.


                enroll: keeps a key that unlocks this keychain in the desktop keyring (GNOME
                Keyring, KWallet, KeePassXC over the Secret Service), so it opens with your login
                session; the passphrase keeps working. unenroll removes that key and slot.
                """
        case "remove-passphrase":
            return """
                usage: lockbox [--keychain PATH] remove-passphrase [--passphrase-stdin] [--yes]

                The keychain then unlocks on this machine without a passphrase (like a phone
                without a passcode); whenPasscodeSetThisDeviceOnly and access-controlled items are
                deleted. It says how many and asks to confirm on the terminal; --yes confirms
                where there is none. set-passphrase sets one again.
                """
        case "set-passphrase":
            return """
                usage: lockbox [--keychain PATH] set-passphrase [--passphrase-stdin]

                Sets a passphrase on a keychain whose passphrase was removed: it is then needed to
                unlock it again, as before remove-passphrase. Asked twice on the terminal;
                --passphrase-stdin reads it from standard input.
                """
        case "login":
            return """
                usage: lockbox [--keychain PATH] login --issuer URL --client-id ID [--scope SCOPE]... [--browser] [--dpop]

                Signs in with the OAuth 2.0 device flow: discovers the issuer (RFC 8414), shows
                the verification address and code and when the code expires, waits for approval,
                and keeps the refresh token in the keychain (afterFirstUnlockThisDeviceOnly).
                --browser opens the system browser (xdg-open) on the authorization page instead
                (authorization code with PKCE, redirected to a listener on 127.0.0.1); without a
                display it says so and uses the device flow. Signing in again revokes the session
                it replaces (RFC 7009), or queues the revocation when the server cannot be reached.
                Ctrl-C cancels and leaves the stored session as it was.
                --dpop binds the session's tokens to a key of its own (DPoP, RFC 9449): a
                non-extractable P-256 key made in the vault, deleted with the session. Every
                request for tokens carries a proof signed by it, and a stolen token is refused
                without the key. Use the tokens with `lockbox token --url`.
                """
        case "token":
            return """
                usage: lockbox [--keychain PATH] token [--issuer URL] [--client-id ID]
                                                        [--url URL [--method METHOD] [--nonce NONCE]]

                Prints a fresh access token and a newline. A token another process refreshed is
                shared in the kernel keyring (memory only, this user's processes, gone at reboot)
                and printed without network; otherwise the refresh token is used (and rotated),
                once for all processes. LOCKBOX_ACCESS_TOKEN_CACHE=off keeps access tokens in
                one process's memory. For scripts: `curl -H "Authorization: Bearer $(lockbox token)"`.
                A session signed in with --dpop: give the request with --url (and --method,
                GET by default; --nonce when the server sent a DPoP-Nonce). The token is
                printed on the first line and the DPoP proof for that one request on the
                second; send them as `Authorization: DPoP TOKEN` and `DPoP: PROOF`. A proof is
                good for one request, once.
                """
        case "logout":
            return """
                usage: lockbox [--keychain PATH] logout [--issuer URL] [--client-id ID] [--retry]

                Revokes the refresh and access tokens (RFC 7009) and forgets the session, also when
                the server cannot be reached: the revocation then waits in the keychain's outbox.
                --retry sends the revocations still waiting.
                """
        case "auth":
            return """
                usage: lockbox [--keychain PATH] auth status [--json]

                Lists the signed-in sessions (issuer, client, account, scopes asked for and granted,
                when the shared access token expires) and pending revocations. Never prints a token.
                """
        case "ssh-agent":
            return """
                usage: lockbox [--keychain PATH] ssh-agent [serve] [-a SOCKET] [--reuse-seconds N]
                       lockbox [--keychain PATH] ssh-agent generate --type ed25519|ecdsa [--comment TEXT] [--user-presence]
                       lockbox [--keychain PATH] ssh-agent list

                Serves the keychain's SSH keys over the SSH agent protocol on SOCKET (default
                $XDG_RUNTIME_DIR/lockbox/ssh-agent.sock), in the foreground; generate makes a
                non-extractable key for it and prints the public key line. See docs/SSH-AGENT.md.
                """
        case "sync":
            return """
                usage: lockbox [--keychain PATH] sync create --database CONNINFO [--passphrase-stdin] [--replace-group]
                       lockbox [--keychain PATH] sync invite [--minutes N]
                       lockbox [--keychain PATH] sync join GROUP --database CONNINFO [--passphrase-stdin] [--replace-group]
                       lockbox [--keychain PATH] sync status [--json]
                       lockbox [--keychain PATH] sync now
                       lockbox [--keychain PATH] sync remove-device DEVICE [--passphrase-stdin]
                       lockbox [--keychain PATH] sync forget-damaged-deletions
                       lockbox [--keychain PATH] sync recover
                       lockbox [--keychain PATH] sync reset [--discard-local-changes]

                Keeps synchronizable items the same on several machines, end-to-end encrypted,
                through a PostgreSQL database. Pairing codes and passphrases are read from standard
                input or the terminal. See docs/SYNC.md.
                """
        case "broker":
            return """
                usage: lockbox broker status
                       lockbox broker stop
                       lockbox broker install-units [--lockboxd PATH]
                       lockbox broker uninstall-units

                status says whether lockboxd answers at its socket (LOCKBOX_BROKER_SOCKET, else
                $XDG_RUNTIME_DIR/lockbox/lockboxd.sock), and its pid, keychain and lock state;
                it exits 1 when none runs. stop asks it to stop: it refuses new requests, finishes
                those it is answering (every acknowledged write is in the keychain file), removes
                its socket and exits, forgetting the keys it held. A socket of another user, or
                one another user listens on, is refused.

                install-units writes lockboxd.socket and lockboxd.service to
                $XDG_CONFIG_HOME/systemd/user/ and enables the socket: systemd then starts lockboxd
                (PATH, default the lockboxd beside lockbox) on the first connection to
                $XDG_RUNTIME_DIR/lockbox/lockboxd.sock. With a running user manager it reloads it
                and starts the socket; without one it says so. uninstall-units stops and removes
                them. Unit files that lockbox did not write are never replaced or removed.
                See docs/BROKER.md.
                """
        case "dump", "dump-keychain":
            return """
                usage: lockbox [--keychain PATH] dump [--json]

                Lists the attributes of every item (never a secret).
                """
        default:
            return nil
        }
    }
}
