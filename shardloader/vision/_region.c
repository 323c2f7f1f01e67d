/* Region decode for the fused image path (shardloader/vision/_region.py builds and loads
 * this file; docs/vision.md, "Decoding only the crop").
 *
 * sl_decode_region decodes the rows [y0, y1) and at least the columns [x0, x1) of a JPEG
 * into `out`, a full-size HWC buffer of `height` x `width` x `channels` bytes, each pixel at
 * its own place; the rest of `out` is left as it was. libjpeg-turbo skips the rows above
 * (jpeg_skip_scanlines), decodes only the iMCU columns that hold [x0, x1)
 * (jpeg_crop_scanline), and stops after row y1 - 1. The caller widens the region by a
 * margin, so that the edges of the decoded area, where fancy upsampling has no neighbour,
 * fall outside what it reads.
 *
 * The decode settings are those of a full decode with the accurate IDCT and fancy
 * upsampling. Any libjpeg error or warning (corrupt data) fails the call: it returns
 * nonzero with libjpeg's message in `message`, and the caller decodes the image another
 * way. Nothing is kept between calls.
 */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

struct sl_error {
    struct jpeg_error_mgr base;
    jmp_buf jump;
    char *message;
    int message_size;
};

static void sl_fail(j_common_ptr info) {
    struct sl_error *error = (struct sl_error *)info->err;
    char text[JMSG_LENGTH_MAX];
    (*info->err->format_message)(info, text);
    snprintf(error->message, (size_t)error->message_size, "%s", text);
    longjmp(error->jump, 1);
}

static void sl_message(j_common_ptr info, int level) {
    if (level < 0) { /* a warning: the data is corrupt */
        sl_fail(info);
    }
}

int sl_decode_region(const unsigned char *data, unsigned long size, int grey, int x0, int y0,
                     int x1, int y1, unsigned char *out, int width, int height, int channels,
                     char *message, int message_size) {
    struct jpeg_decompress_struct info;
    struct sl_error error;
    JSAMPROW row;
    JDIMENSION x_offset, x_width;
    int y;

    memset(&info, 0, sizeof(info));
    info.err = jpeg_std_error(&error.base);
    error.base.error_exit = sl_fail;
    error.base.emit_message = sl_message;
    error.message = message;
    error.message_size = message_size;
    if (setjmp(error.jump)) {
        jpeg_destroy_decompress(&info);
        return 1;
    }
    jpeg_create_decompress(&info);
    jpeg_mem_src(&info, data, size);
    jpeg_read_header(&info, TRUE);
    info.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
    info.dct_method = JDCT_ISLOW;
    info.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&info);
    if ((int)info.output_width != width || (int)info.output_height != height ||
        info.output_components != channels || x0 < 0 || y0 < 0 || x1 > width ||
        y1 > height || x0 >= x1 || y0 >= y1) {
        snprintf(message, (size_t)message_size, "region or size does not fit the image");
        jpeg_destroy_decompress(&info);
        return 2;
    }
    x_offset = (JDIMENSION)x0;
    x_width = (JDIMENSION)(x1 - x0);
    jpeg_crop_scanline(&info, &x_offset, &x_width);
    if (y0 > 0) {
        jpeg_skip_scanlines(&info, (JDIMENSION)y0);
    }
    for (y = y0; y < y1; y++) {
        row = out + ((size_t)y * (size_t)width + x_offset) * (size_t)channels;
        if (jpeg_read_scanlines(&info, &row, 1) != 1) {
            snprintf(message, (size_t)message_size, "libjpeg returned no row %d", y);
            jpeg_destroy_decompress(&info);
            return 3;
        }
    }
    jpeg_abort_decompress(&info);
    jpeg_destroy_decompress(&info);
    return 0;
}
