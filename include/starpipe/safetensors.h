/* Safetensors files for checkpoints and gradient dumps: an atomic writer and a strict
 * reader that validates the whole file before returning anything. Files are the Hugging
 * Face format, loadable by the Python `safetensors` package.
 *
 *   int64_t shape[2] = {7, 13};
 *   sp_st_tensor t = {"wte", SP_ST_F32, 2, shape, wte};
 *   sp_st_meta m = {"step", "1200"};
 *   sp_status s = sp_safetensors_write("ckpt.safetensors", &t, 1, &m, 1, SP_ST_CHECKSUM);
 *
 *   sp_safetensors *f = sp_safetensors_open("ckpt.safetensors", 0, &s);
 *   if (!f) fprintf(stderr, "%s\n", sp_last_error());   // SP_ERR_IO or SP_ERR_FORMAT
 *   const sp_st_tensor *w = sp_safetensors_find(f, "wte");  // NULL if absent
 *   const float *wd = w->data;                              // (7,13), valid until close
 *   sp_safetensors_close(f);
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON, the data section.
 * The writer pads the JSON with spaces so the data section starts 8-byte aligned and
 * stores tensors contiguously in the order given.
 *
 * Checksum (SP_ST_CHECKSUM): two `__metadata__` entries, each 8 lowercase hex digits of
 * a CRC-32 (the zlib/PNG polynomial):
 *   "starpipe.crc32"        over the data section (all bytes after the header);
 *   "starpipe.header_crc32" over the 8 length bytes followed by the N header bytes,
 *                           with this entry's own 8 digits read as "00000000".
 * CRC-32 detects every error confined to 32 consecutive bits, so any single flipped byte
 * is caught. The reader verifies both when present and refuses a file that holds the
 * data entry without the header entry, so a flip inside the header entry's key is caught
 * too. SP_ST_REQUIRE_CHECKSUM refuses files without them. This guards against
 * corruption, not against a deliberate forgery. */
#ifndef STARPIPE_SAFETENSORS_H
#define STARPIPE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The dtypes of the reference implementation with a whole number of bytes. */
typedef enum {
    SP_ST_BOOL, SP_ST_U8, SP_ST_I8, SP_ST_F8_E5M2, SP_ST_F8_E4M3,
    SP_ST_I16, SP_ST_U16, SP_ST_F16, SP_ST_BF16,
    SP_ST_I32, SP_ST_U32, SP_ST_F32,
    SP_ST_I64, SP_ST_U64, SP_ST_F64,
    SP_ST_NDTYPES
} sp_st_dtype;

/* One tensor: row-major, little-endian. A scalar has ndim 0 (shape may be NULL). */
typedef struct {
    const char *name;       /* UTF-8, unique in a file, not "__metadata__" */
    sp_st_dtype dtype;
    int ndim;               /* 0..64 */
    const int64_t *shape;   /* ndim entries, each >= 0 */
    const void *data;       /* sp_st_nbytes(t) bytes (may be NULL when that is 0) */
} sp_st_tensor;

typedef struct {
    const char *key;        /* UTF-8, unique */
    const char *value;
} sp_st_meta;

/* Flags of sp_safetensors_write. */
#define SP_ST_CHECKSUM 1u          /* add the starpipe.crc32 entries */
/* Flags of sp_safetensors_open. */
#define SP_ST_REQUIRE_CHECKSUM 1u  /* refuse a file without the starpipe.crc32 entries */

#define SP_ST_MAX_HEADER ((uint64_t)100000000) /* the reference's header limit, bytes */

/* "F32", or NULL for a value out of range; the size of one element in bytes (0 then). */
const char *sp_st_dtype_name(sp_st_dtype d);
size_t sp_st_dtype_size(sp_st_dtype d);
/* Bytes of the tensor's data: product of shape * dtype size (0 if invalid). */
size_t sp_st_nbytes(const sp_st_tensor *t);

/* Writes n tensors and n_meta metadata entries to path atomically: into
 * path + ".tmp.<pid>" in the same directory, flushed and fsync'ed, renamed over path,
 * then the directory fsync'ed. On failure the temporary is removed and any previous
 * file at path is left as it was. Errors: SP_ERR_ARG (bad tensor or metadata: a
 * duplicate or empty name, invalid UTF-8, a negative dimension, more than 64 dimensions,
 * a reserved "starpipe.crc32" key with SP_ST_CHECKSUM), SP_ERR_IO, SP_ERR_NOMEM. Two
 * writers of the same path in one process at once are not supported (they share the
 * temporary). */
sp_status sp_safetensors_write(const char *path, const sp_st_tensor *tensors, int n,
                               const sp_st_meta *meta, int n_meta, unsigned flags);

typedef struct sp_safetensors sp_safetensors;

/* Reads the whole file into memory and validates it: header JSON (strict), dtypes, shapes against
 * offsets, offsets inside the data section, no overlaps, no holes, unique names,
 * checksums when present. Returns NULL with *status (if status is non-NULL) set to
 * SP_ERR_IO (cannot open or read), SP_ERR_FORMAT (malformed, truncated, checksum
 * mismatch) or SP_ERR_NOMEM, and a message naming the file in sp_last_error(). */
sp_safetensors *sp_safetensors_open(const char *path, unsigned flags, sp_status *status);
void sp_safetensors_close(sp_safetensors *f);

/* Tensors in file order (by data offset). Pointers stay valid until close; data is
 * aligned to its element size (a misaligned tensor of a foreign file is copied). */
int sp_safetensors_count(const sp_safetensors *f);
const sp_st_tensor *sp_safetensors_at(const sp_safetensors *f, int i);     /* NULL if out of range */
const sp_st_tensor *sp_safetensors_find(const sp_safetensors *f, const char *name); /* NULL if absent */

/* Metadata entries in header order, the starpipe.crc32 entries included. */
int sp_safetensors_meta_count(const sp_safetensors *f);
const sp_st_meta *sp_safetensors_meta_at(const sp_safetensors *f, int i);  /* NULL if out of range */
const char *sp_safetensors_meta(const sp_safetensors *f, const char *key); /* NULL if absent */

/* CRC-32 (zlib polynomial) of n bytes continuing from crc (start with 0). */
uint32_t sp_crc32(uint32_t crc, const void *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
