/* The fused path's last write (shardloader/vision/_write.py builds and loads this file;
 * docs/vision.md, "Writing each image in one pass").
 *
 * sl_planes takes one rendered uint8 image, `height` x `width` pixels of `channels` (1 or 3)
 * interleaved bytes, rows `row_stride` bytes apart (a view of a larger image works), and
 * writes its planes, (channels, height, width) C-contiguous, into `out`, flipping
 * left-right (`flip_x`) and top-bottom (`flip_y`) as it reads. In one pass, where OpenCV
 * takes three: a flip into a buffer, a split into planes, and a lookup per plane.
 *
 * With a `table` (channels x 256 float32: ToTensor and Normalize, precomputed), `out` is
 * float32 and every value is its channel's entry, the table's very number; without one
 * (NULL), `out` is uint8 and gets the bytes. It returns nonzero for a channel count it does
 * not take, having written nothing.
 */
#include <stddef.h>
#include <stdint.h>

int sl_planes(const uint8_t *src, int height, int width, int channels, long row_stride,
              int flip_x, int flip_y, const float *table, void *out) {
    size_t plane = (size_t)height * (size_t)width;
    long step = flip_x ? -channels : channels;
    int y, x, c;
    if (channels != 1 && channels != 3) {
        return 1;
    }
    for (y = 0; y < height; y++) {
        const uint8_t *row = src + (size_t)(flip_y ? height - 1 - y : y) * (size_t)row_stride;
        /* Read forwards, or from the row's last pixel backwards. */
        const uint8_t *first = flip_x ? row + (size_t)(width - 1) * (size_t)channels : row;
        size_t at = (size_t)y * (size_t)width;
        if (table != NULL && channels == 3) { /* the common case, its three planes at once */
            const float *t0 = table, *t1 = table + 256, *t2 = table + 512;
            float *o0 = (float *)out + at, *o1 = o0 + plane, *o2 = o1 + plane;
            for (x = 0; x < width; x++) {
                const uint8_t *p = first + x * step;
                o0[x] = t0[p[0]];
                o1[x] = t1[p[1]];
                o2[x] = t2[p[2]];
            }
        } else {
            for (c = 0; c < channels; c++) {
                const uint8_t *p = first + c;
                if (table != NULL) {
                    float *o = (float *)out + c * plane + at;
                    const float *t = table + 256 * c;
                    for (x = 0; x < width; x++) {
                        o[x] = t[p[x * step]];
                    }
                } else {
                    uint8_t *o = (uint8_t *)out + c * plane + at;
                    for (x = 0; x < width; x++) {
                        o[x] = p[x * step];
                    }
                }
            }
        }
    }
    return 0;
}
