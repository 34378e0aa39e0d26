/* TLS through OpenSSL for the engine: one SSL_CTX per engine (a run's clients share their
 * endpoint's settings) and an SSL per client over memory BIOs. OpenSSL never touches the
 * socket: the engine reads it with recvmsg, which keeps the kernel's receive stamps, and
 * writes it with its own send, which keeps the byte count its send stamps are keyed by;
 * the records go through the client's `wire` buffer (layers.c). */
#include <arpa/inet.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "client.h"

static int config_error(mqe_engine *e, SSL_CTX *ctx, const char *what) {
    unsigned long code = ERR_peek_last_error();
    const char *reason = code ? ERR_reason_error_string(code) : NULL;
    snprintf(e->error, sizeof e->error, "TLS settings: %s%s%s", what, reason ? ": " : "",
             reason ? reason : "");
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return -1;
}

/* Every certificate of a PEM text, added to the store; how many, or -1. */
static int load_cas(X509_STORE *store, const char *pem) {
    BIO *bio = BIO_new_mem_buf(pem, -1);
    if (bio == NULL)
        return -1;
    int count = 0;
    X509 *cert;
    while ((cert = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
        int added = X509_STORE_add_cert(store, cert);
        X509_free(cert);
        if (!added) {
            BIO_free(bio);
            return -1;
        }
        count++;
    }
    BIO_free(bio);
    if (count)
        ERR_clear_error();  /* the end of the text reads as "no start line" */
    return count;
}

/* The client certificate (and any chain after it) and its key. */
static int load_client_certificate(mqe_engine *e, SSL_CTX *ctx, const char *cert_pem,
                                   const char *key_pem) {
    BIO *bio = BIO_new_mem_buf(cert_pem, -1);
    X509 *leaf = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    if (leaf == NULL || SSL_CTX_use_certificate(ctx, leaf) != 1) {
        X509_free(leaf);
        BIO_free(bio);
        return config_error(e, ctx, "the client certificate (cert_file) does not load");
    }
    X509 *link;
    while ((link = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL)
        if (SSL_CTX_add0_chain_cert(ctx, link) != 1)
            X509_free(link);
    ERR_clear_error();
    BIO_free(bio);
    bio = BIO_new_mem_buf(key_pem, -1);
    EVP_PKEY *key = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    int matches = key != NULL && X509_check_private_key(leaf, key) == 1;
    X509_free(leaf);
    if (key != NULL && !matches) {
        EVP_PKEY_free(key);
        ERR_clear_error();
        return config_error(e, ctx, "the client key (key_file) is not the key of the client "
                                    "certificate (cert_file)");
    }
    if (key == NULL || SSL_CTX_use_PrivateKey(ctx, key) != 1) {
        EVP_PKEY_free(key);
        return config_error(e, ctx, "the client key (key_file) does not load");
    }
    EVP_PKEY_free(key);
    return 0;
}

int mqe_tls_configure(mqe_engine *e, const char *ca_pem, const char *cert_pem,
                      const char *key_pem, int verify) {
    ERR_clear_error();
    if ((cert_pem == NULL) != (key_pem == NULL)) {
        snprintf(e->error, sizeof e->error, "TLS settings: a client certificate needs both "
                 "its certificate and its key");
        return -1;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return config_error(e, ctx, "no TLS context");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (ca_pem != NULL) {
        int count = load_cas(SSL_CTX_get_cert_store(ctx), ca_pem);
        if (count <= 0)
            return config_error(e, ctx, count == 0 ? "the CA certificates (ca_file) hold no "
                                                     "PEM certificate"
                                                   : "the CA certificates (ca_file) do not load");
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        return config_error(e, ctx, "the system's CA certificates do not load");
    }
    if (cert_pem != NULL && load_client_certificate(e, ctx, cert_pem, key_pem) != 0)
        return -1;
    SSL_CTX_set_verify(ctx, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    mqe_tls_free_context(e);
    e->ssl_ctx = ctx;
    e->tls_verify = verify != 0;
    return 0;
}

void mqe_tls_free_context(mqe_engine *e) {
    SSL_CTX_free(e->ssl_ctx);
    e->ssl_ctx = NULL;
}

static int is_ip_address(const char *name) {
    unsigned char address[16];
    return inet_pton(AF_INET, name, address) == 1 || inet_pton(AF_INET6, name, address) == 1;
}

/* What OpenSSL wrote moves to the client's wire buffer. */
static int move_out(mqe_engine *e, mqe_client *c) {
    BIO *wbio = SSL_get_wbio(c->ssl);
    size_t pending = BIO_ctrl_pending(wbio);
    if (pending == 0)
        return 0;
    if (mqe_wire_reserve(e, c, pending) != 0)
        return -1;
    int n = BIO_read(wbio, c->wire + c->wire_len, (int)pending);
    if (n > 0) {
        c->wire_len += (size_t)n;
        c->wire_bytes += (uint64_t)n;
    }
    return 0;
}

int mqe_tls_start(mqe_engine *e, mqe_client *c) {
    if (e->ssl_ctx == NULL) {
        mqe_client_fail(e, c, "TLS is not configured (mqe_tls_configure)");
        return -1;
    }
    SSL *ssl = SSL_new(e->ssl_ctx);
    BIO *rbio = BIO_new(BIO_s_mem()), *wbio = BIO_new(BIO_s_mem());
    if (ssl == NULL || rbio == NULL || wbio == NULL) {
        SSL_free(ssl);
        BIO_free(rbio);
        BIO_free(wbio);
        mqe_client_fail(e, c, "out of memory for a TLS session");
        return -1;
    }
    BIO_set_mem_eof_return(rbio, -1);  /* no bytes yet is "read again", not an end */
    SSL_set_bio(ssl, rbio, wbio);
    SSL_set_connect_state(ssl);
    c->ssl = ssl;
    const char *name = c->server_name ? c->server_name : c->host;
    int ip = is_ip_address(name);
    int named = ip || SSL_set_tlsext_host_name(ssl, name) == 1;  /* SNI carries names only */
    if (e->tls_verify)
        named &= ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1
                    : SSL_set1_host(ssl, name) == 1;
    if (!named) {
        mqe_client_fail(e, c, "TLS to broker %s:%d: the server name '%s' cannot be used",
                        c->host, c->port, name);
        return -1;
    }
    c->stage = MQE_STAGE_TLS;
    return mqe_tls_handshake(e, c) < 0 ? -1 : 0;
}

/* The client fails naming the broker, the step and OpenSSL's reason (with the X509 verify
 * error where the chain or the name was refused). */
static void tls_failed(mqe_engine *e, mqe_client *c, int ssl_error) {
    unsigned long code = ERR_get_error();
    const char *reason = code ? ERR_reason_error_string(code) : NULL;
    char detail[160];
    long verify = SSL_get_verify_result(c->ssl);
    if (reason && verify != X509_V_OK)
        snprintf(detail, sizeof detail, "%s (%s)", reason,
                 X509_verify_cert_error_string(verify));
    else if (reason)
        snprintf(detail, sizeof detail, "%s", reason);
    else if (ssl_error == SSL_ERROR_ZERO_RETURN)
        snprintf(detail, sizeof detail, "the broker ended the TLS session (close_notify)");
    else
        snprintf(detail, sizeof detail, "SSL error %d", ssl_error);
    ERR_clear_error();
    if (c->stage == MQE_STAGE_TLS)
        mqe_client_fail(e, c, "TLS handshake with broker %s:%d failed: %s", c->host, c->port,
                        detail);
    else
        mqe_client_fail(e, c, "TLS with broker %s:%d failed: %s", c->host, c->port, detail);
}

int mqe_tls_handshake(mqe_engine *e, mqe_client *c) {
    ERR_clear_error();
    int r = SSL_do_handshake(c->ssl);
    if (move_out(e, c) != 0)
        return -1;
    if (r == 1) {
        snprintf(c->tls_description, sizeof c->tls_description, "%s %s",
                 SSL_get_version(c->ssl), SSL_get_cipher_name(c->ssl));
        return 1;
    }
    int error = SSL_get_error(c->ssl, r);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE)
        return 0;
    tls_failed(e, c, error);
    return -1;
}

int mqe_tls_absorb(mqe_client *c, const uint8_t *data, size_t len) {
    BIO *rbio = SSL_get_rbio(c->ssl);
    while (len) {
        int chunk = len > INT_MAX ? INT_MAX : (int)len;
        int n = BIO_write(rbio, data, chunk);
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

long mqe_tls_read(mqe_engine *e, mqe_client *c, uint8_t *to, size_t cap) {
    ERR_clear_error();
    int n = SSL_read(c->ssl, to, cap > INT_MAX ? INT_MAX : (int)cap);
    if (move_out(e, c) != 0)  /* e.g. a KeyUpdate answered */
        return -1;
    if (n > 0)
        return n;
    int error = SSL_get_error(c->ssl, n);
    if (error == SSL_ERROR_WANT_READ)
        return 0;
    tls_failed(e, c, error);
    return -1;
}

int mqe_tls_write(mqe_engine *e, mqe_client *c, const uint8_t *data, size_t len) {
    ERR_clear_error();
    /* memory BIOs take every record whole: a write is done or failed, never partial */
    if (len && SSL_write(c->ssl, data, (int)len) != (int)len) {
        tls_failed(e, c, SSL_get_error(c->ssl, -1));
        return -1;
    }
    return move_out(e, c);
}

int mqe_tls_shutdown(mqe_engine *e, mqe_client *c) {
    if (c->ssl == NULL || c->stage != MQE_STAGE_READY)
        return 0;
    ERR_clear_error();
    SSL_shutdown(c->ssl);
    ERR_clear_error();
    return move_out(e, c);
}

void mqe_tls_free(mqe_client *c) {
    SSL_free(c->ssl);
    c->ssl = NULL;
}
